"""The one way a run's numbers are written for people: durations, percentages, counts.
The CLI, the Monitor and the Runs list all use these, so one run reads the same everywhere."""
from __future__ import annotations

import math


def real(v) -> float | None:
    """A number as read from an event, a status file or a sampler; None for what is not one: None,
    True/False, text that is no number, and NaN (a diverged loss, a sensor's gap), which every
    formatter here shows as missing anyway. A number written as text ("0.5") counts."""
    if type(v) is float:  # the common case first: the reducer parses several per event
        return v if v == v else None
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if f != f else f


def duration(s: float | None, missing: str = "--:--") -> str:
    """h:mm:ss, or mm:ss under an hour; `missing` when unknown."""
    if s is None or s != s or s < 0:
        return missing
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def pct(v: float | None, digits: int = 1, missing: str = "-") -> str:
    """A 0..1 share as a percentage."""
    return missing if v is None or v != v else f"{100 * v:.{digits}f}%"


def num(v: float | None, spec: str = ".4f", missing: str = "-") -> str:
    return missing if v is None or v != v else format(v, spec)


def mib(v: float | None, missing: str = "-") -> str:
    """A size in MiB, short: 512M, 1.5G."""
    if v is None or v != v:
        return missing
    return f"{v / 1024:.1f}G" if v >= 1024 else f"{v:.0f}M"


def rate(v: float | None) -> str:
    """samples/s with thousands separators."""
    return "-" if v is None or v != v else f"{v:,.0f}"


def ago(s: float | None) -> str:
    """How long since a rank was last heard of: 3.2s, 41s, 02:10."""
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    return duration(s)


def epoch_at(epochs_done: int, batches_done: int) -> str:
    """Where a position (the engine's 0-based count of finished epochs, and batches into the
    next) is, for people: 'end of epoch 2', or 'epoch 3' while inside it."""
    if batches_done == 0 and epochs_done > 0:
        return f"end of epoch {epochs_done}"
    return f"epoch {epochs_done + 1}"


def fit_columns(cols: list[tuple[str, str]], cells: list[dict], width: int | None,
                drop: tuple[str, ...] = ()) -> tuple[list[tuple[str, str]], list[str]]:
    """The columns of a table (key, label) that fit `width` with two spaces between columns, and
    the labels left out: the keys in `drop` go in that order until a row fits on one line. One
    rule for every table of runs, printed (`fit_table`) or in the app (whose cells are padded by
    one on each side: it passes its width less two)."""
    def need(cols) -> int:
        if not cols:
            return 0
        return sum(max([len(label)] + [len(str(c[k])) for c in cells]) for k, label in cols) + 2 * (len(cols) - 1)

    cols, left_out = list(cols), []
    for key in drop:
        if width is None or need(cols) <= width:
            break
        left_out += [label for k, label in cols if k == key]
        cols = [c for c in cols if c[0] != key]
    return cols, left_out


def rank_groups(devices: list[tuple[int, str]]) -> str:
    """Ranks and what each uses, consecutive ranks with the same value said once:
    [(0, 'cpu'), (1, 'cpu'), (2, 'cuda:1')] -> 'ranks 0-1: cpu; rank 2: cuda:1' (25 ranks on the
    CPU were 25 items of `rank N: cpu`)."""
    groups: list[list] = []
    for rank, what in devices:
        if groups and groups[-1][2] == what and groups[-1][1] == rank - 1:
            groups[-1][1] = rank
        else:
            groups.append([rank, rank, what])
    return "; ".join(f"rank {a}: {w}" if a == b else f"ranks {a}-{b}: {w}" for a, b, w in groups)


def rank_span(ranks: list[int]) -> str:
    """Rank numbers as runs of consecutive ones: [0, 1, 2, 3, 8] -> '0-3,8'."""
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def ranks_text(ranks: list[int], most: int = 4) -> str:
    """Ranks named in a line: '0,1' when few, else as runs ('136-143,203'): 256 silent ranks
    must not push the rest of a header off the line."""
    return ",".join(map(str, ranks)) if len(ranks) <= most else rank_span(ranks)


def device_list(devices: list[str]) -> str:
    """A node's devices, one per local rank, as a log line says them: listed when few, else grouped
    (64 ranks on the CPU read `cpu, cpu, ...` 64 times: now `ranks 0-63: cpu`)."""
    plain = ", ".join(devices)
    if len(devices) <= 8:
        return plain
    grouped = rank_groups(list(enumerate(devices)))
    return grouped if len(grouped) < len(plain) else plain


def fit_table(cols: list[tuple[str, str]], cells: list[dict], width: int | None = None,
              drop: tuple[str, ...] = (), all_in: str = "") -> list[str]:
    """An aligned text table of `cols` (key, label) over `cells`; with a width (a terminal's),
    the keys in `drop` are left out in that order until every line fits, since a table whose rows
    wrap onto two lines at 80 columns cannot be read, and a last line says which (and `all_in`,
    where they all are); a line still too wide then is cut with an ellipsis."""
    def render(cols):
        grid = [tuple(label for _, label in cols)] + [tuple(str(c[k]) for k, _ in cols) for c in cells]
        widths = [max(len(g[i]) for g in grid) for i in range(len(cols))]
        return ["  ".join(v.ljust(w) for v, w in zip(g, widths)).rstrip() for g in grid]

    cols, left_out = fit_columns(cols, cells, width, drop)
    lines = render(cols)
    if width is not None:
        lines = [ln if len(ln) <= width else ln[:max(1, width - 1)] + "…" for ln in lines]
    if left_out:
        lines.append(f"(left out at {width} columns: {', '.join(left_out)}{'; all in ' + all_in if all_in else ''})")
    return lines


def wrap(text: str, width: int | None, indent: str = "  ") -> str:
    """Each line of `text` wrapped at `width`, its continuation lines under the line's own indent
    plus `indent`: a terminal wraps at column 0 and mid-number (`acc 88.9` / `%`), so a long
    message read as two. Lines that fit (and tracebacks' indentation) are kept as they are.

    Breaks fall only between words, never inside what a user copies: a path or any other token
    too long for the line goes on a line of its own, whole (a checkpoint path pasted from the
    terminal must work), and a command (`in backquotes`, `torchdeck ...` up to the end of its
    clause, `--set key=value`) stays on one line."""
    if width is None:
        return text
    import textwrap

    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        glued = _glue_commands(line.strip())
        filled = textwrap.fill(glued, width, initial_indent=lead, subsequent_indent=lead + indent,
                               break_on_hyphens=False, break_long_words=False)
        out.append(filled.replace(_GLUE, " "))
    return "\n".join(out)


_GLUE = "\x00"  # a space that must not become a line break


def _glue_commands(text: str) -> str:
    """`text` with the spaces inside each command made unbreakable (see wrap)."""
    import re

    def glue(m):
        return m.group(0).replace(" ", _GLUE)

    text = re.sub(r"`[^`]*`", glue, text)
    text = re.sub(r"(?<!\S)(--[\w-]+) (?!-)(\S+)", glue, text)  # --set key=value, --runs-dir DIR
    # torchdeck and its arguments, up to a word that ends the clause (`;`, `,`, `)`) or the line
    return re.sub(r"(?<![\w/.-])torchdeck(?: (?![(`])[^\s;,)]+)+", glue, text)


def steps_rate(v: float | None) -> str:
    """A pace people read: optimizer steps/s (and a node's pace in any unit) with three significant
    figures, `3.42`, `34.2`, `342`, `3,420`, `0.0523`, as tqdm prints it/s. Three because a rate
    moves by a few percent from window to window: `3.4` hid a 1.5 % step (3.42 -> 3.37) and a slow
    model's `0.1` said nothing; a fourth figure is noise. Whole numbers from 100 up read as
    samples/s do (`fmt.rate`). The one format of steps/s in the CLI (run/launch/attach), the Monitor
    and the node views: one number reads the same everywhere."""
    if v is None or v != v:
        return "-"
    if v < 0:
        return "-" + steps_rate(-v)
    r = float(f"{v:.3g}")  # rounded to three figures first: 9.996 is `10.0`, not `10.00`
    if r >= 100:
        return f"{v:,.0f}"
    if r < 0.001:  # nothing trains this slowly; no row of zeros either
        return f"{r:.3g}"
    return f"{r:.{2 - math.floor(math.log10(r))}f}"
