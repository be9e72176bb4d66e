"""Where a run's processes are right now: the Python stacks of every rank of this node (and of
the supervisor), taken without stopping them, and grouped so that 8 ranks in the same all-reduce
read as one line and the odd one out stands out.

Each process registers `faulthandler` on STACK_SIGNAL at start (`install`), writing into its own
file of the run directory (RunDir.stacks_path). faulthandler writes from the C signal handler,
so a rank blocked inside gloo, NCCL or a C sleep still answers. `collect` empties the files,
signals the processes, waits until each file is written, and `group` reduces the dumps to one
line per place. Torch-free and textual-free: `torchdeck stacks`, the Monitor and the
supervisor's watchdog all call this.
"""
from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

STACK_SIGNAL = signal.SIGUSR2  # nothing else in the engine uses it (SLURM's requeue is SIGUSR1)
WAIT_S = 3.0  # how long `collect` waits for the dumps
_installed = []  # the open files faulthandler writes to: they must outlive the registration

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


def install(path: Path) -> None:
    """Make this process dump every thread's stack into `path` on STACK_SIGNAL (and go on)."""
    fh = open(path, "a")
    faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    _installed.append(fh)


def ignore() -> None:
    """Stop answering STACK_SIGNAL, and ignore it rather than die of it: a process about to exit
    (faulthandler's finalization would restore the default action, which terminates)."""
    faulthandler.unregister(STACK_SIGNAL)
    signal.signal(STACK_SIGNAL, signal.SIG_IGN)


@dataclass
class Frame:
    file: str
    line: int
    func: str

    @property
    def library(self) -> bool:
        """torch or the standard library rather than the user's or torchdeck's own code."""
        f = self.file
        if "/engine/" in f or "/cli/" in f:
            return False
        return ("site-packages" in f or "/lib/python" in f or f.startswith("<")
                or "/torch/" in f)

    def short(self) -> str:
        parts = Path(self.file).parts
        keep = 2 if len(parts) > 1 and parts[-2] in ("engine", "runs", "strategies", "autograd", "distributed",
                                                    "nn", "modules", "parallel", "utils", "data") else 1
        return f"{self.func} ({'/'.join(parts[-keep:])}:{self.line})"

    def to_list(self) -> list:
        return [self.file, self.line, self.func]


@dataclass
class Thread:
    ident: str
    current: bool
    frames: list = field(default_factory=list)  # innermost first, as faulthandler prints them

    @property
    def is_main(self) -> bool:
        """Threads started by `threading` begin in its _bootstrap; the main thread does not."""
        return bool(self.frames) and not (self.frames[-1].func == "_bootstrap"
                                          and self.frames[-1].file.endswith("threading.py"))


def parse(text: str) -> list[Thread]:
    """The threads of faulthandler's last dump in `text` (lines that are not part of one are skipped)."""
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if any(t.ident == m.group(2) for t in threads):  # a second dump begins: keep the newest
                threads = []
            threads.append(Thread(m.group(2), m.group(1) == "Current thread"))
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m.group(1), int(m.group(2)), m.group(3).strip()))
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    """The thread that trains: the main thread (the deepest one if the guess is ambiguous)."""
    mains = [t for t in threads if t.is_main] or threads
    return max(mains, key=lambda t: len(t.frames)) if mains else None


def where(thread: Thread | None) -> str:
    """One line: the innermost frame and, when that is inside torch or the standard library, the
    nearest frame of the user's (or torchdeck's) code that led there."""
    if thread is None or not thread.frames:
        return "no Python frames"
    inner = thread.frames[0]
    text = inner.short()
    if inner.library:
        mine = next((f for f in thread.frames if not f.library), None)
        if mine is not None:
            text += f" <- {mine.short()}"
    return text


@dataclass
class ProcStack:
    who: str  # "rank 3" or "supervisor"
    rank: int | None
    pid: int
    file: str
    threads: list = field(default_factory=list)
    error: str = ""  # why there is no dump (the process is gone, it did not answer)

    @property
    def where(self) -> str:
        return f"no dump: {self.error}" if self.error else where(main_thread(self.threads))

    def main_frames(self) -> list[Frame]:
        t = main_thread(self.threads)
        return list(t.frames) if t else []


def collect(targets: list[tuple[str, int | None, int, Path]], wait_s: float = WAIT_S) -> list[ProcStack]:
    """targets: (who, rank, pid, file). Empty each file, signal each pid, and read the dumps back
    once every file stopped growing (or after wait_s). Only pass pids known to have installed
    the handler: STACK_SIGNAL's default action ends a process."""
    out = []
    for who, rank, pid, path in targets:
        ps = ProcStack(who, rank, pid, str(path))
        try:
            os.truncate(path, 0)
            os.kill(pid, STACK_SIGNAL)
        except ProcessLookupError:
            ps.error = "the process is gone"
        except OSError as exc:
            ps.error = f"cannot signal it: {exc.strerror or exc}"
        out.append(ps)
    deadline = time.monotonic() + wait_s
    sizes: dict = {}
    while time.monotonic() < deadline:
        now_sizes = {}
        for ps in out:
            if not ps.error:
                try:
                    now_sizes[ps.file] = os.stat(ps.file).st_size
                except OSError:
                    now_sizes[ps.file] = 0
        if all(now_sizes.values()) and now_sizes == sizes:
            break  # every file written and none grew since the last look
        sizes = now_sizes
        time.sleep(0.1)
    for ps in out:
        if ps.error:
            continue
        try:
            ps.threads = parse(Path(ps.file).read_text(errors="replace"))
        except OSError as exc:
            ps.error = f"cannot read {ps.file}: {exc.strerror or exc}"
            continue
        if not ps.threads:
            ps.error = f"it wrote no stack within {wait_s:.0f} s"
    return out


def group(stacks: list[ProcStack]) -> list[dict]:
    """Processes in the same place, together: [{"who": "ranks 0,2,3", "ranks": [...], "where": ...,
    "frames": [[file, line, func], ...] of the first of them}], ranks first, in rank order."""
    groups: dict = {}
    for ps in sorted(stacks, key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0)):
        g = groups.setdefault(ps.where, {"ranks": [], "others": [], "where": ps.where,
                                         "frames": [f.to_list() for f in ps.main_frames()]})
        (g["ranks"] if ps.rank is not None else g["others"]).append(ps.rank if ps.rank is not None else ps.who)
    out = []
    for g in groups.values():
        names = []
        if g["ranks"]:
            names.append(f"rank{'s' if len(g['ranks']) > 1 else ''} {','.join(map(str, g['ranks']))}")
        names += g.pop("others")
        g["who"] = ", ".join(names)
        out.append(g)
    return out


def summary(groups: list[dict]) -> str:
    """One line: "ranks 0,2: all_reduce (...) | rank 1: forward (usermodels.py:12)"."""
    return " | ".join(f"{g.get('who')}: {g.get('where')}" for g in groups)


def render(groups: list[dict], depth: int = 12) -> list[str]:
    """The grouped stacks as text lines: each group's line, then its main thread, innermost first."""
    lines = []
    for g in groups if isinstance(groups, list) else []:  # read back from an events file: input
        if not isinstance(g, dict):
            continue
        lines.append(f"{g.get('who')}: {g.get('where')}")
        frames = g.get("frames") if isinstance(g.get("frames"), list) else []
        for f in frames[:depth]:
            try:
                file, line, func = f
            except (TypeError, ValueError):
                continue
            parts = Path(str(file)).parts
            file = str(file) if len(parts) <= 4 else "…/" + "/".join(parts[-3:])  # the .stacks files have it whole
            lines.append(f"    {func}  {file}:{line}")
        if len(frames) > depth:
            lines.append(f"    ... {len(frames) - depth} outer frame(s)")
    return lines


def run_targets(rd) -> list[tuple[str, int | None, int, Path]]:
    """The processes of a run, on this host, that can be asked for their stacks: its live
    supervisor and every rank that reported itself ready here, each only if its stacks file
    exists (it installed the handler) and the pid still belongs to that process (started no
    later than it reported)."""
    import socket

    import psutil

    from .. import events

    host = socket.gethostname()
    out = []
    sup = rd.supervisor_pid() if rd.pid_path.exists() else None
    if sup and rd.stacks_path(None).exists():
        out.append(("supervisor", None, sup, rd.stacks_path(None)))
    ranks: dict = {}
    for ev in events.iter_events(rd.events_path):
        if ev.get("kind") == "rank_ready" and isinstance(ev.get("pid"), int) and isinstance(ev.get("rank"), int):
            if ev.get("host") in (None, host):
                ranks[ev["rank"]] = (ev["pid"], float(ev.get("t") or 0))
    for rank, (pid, t) in sorted(ranks.items()):
        path = rd.stacks_path(rank)
        try:
            started = psutil.Process(pid).create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if path.exists() and started <= t + 1.0:
            out.append((f"rank {rank}", rank, pid, path))
    return out


def take(rd, wait_s: float = WAIT_S) -> tuple[list[dict], list[ProcStack]]:
    """(groups, per-process stacks) of a run's live processes on this host, now."""
    stacks = collect(run_targets(rd), wait_s)
    return group(stacks), stacks


_STACKS_FILE = re.compile(r"rank(\d+)\.stacks|supervisor\.stacks")


def recorded(rd) -> dict | None:
    """The newest stacks a run's processes wrote into its directory (rank<N>.stacks,
    supervisor.stacks), read back once they are gone: {"t", "groups", "files"}, or None when no
    file holds a dump. Every taking writes these files (`t` in the Monitor, `torchdeck stacks`,
    the watchdog), not only the watchdog's, which alone becomes a `stacks` event. The files of
    one taking are written within WAIT_S of each other; older dumps of an earlier one stay out."""
    found = []
    try:
        names = sorted(os.listdir(rd.path))
    except OSError:
        return None
    for name in names:
        m = _STACKS_FILE.fullmatch(name)
        if not m:
            continue
        path = Path(rd.path) / name
        try:
            threads = parse(path.read_text(errors="replace"))
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if threads:
            rank = int(m.group(1)) if m.group(1) is not None else None
            found.append((mtime, ProcStack("supervisor" if rank is None else f"rank {rank}", rank, 0, str(path),
                                           threads)))
    if not found:
        return None
    newest = max(t for t, _ in found)
    taken = [ps for t, ps in found if t >= newest - WAIT_S - 1.0]
    return {"t": newest, "groups": group(taken), "files": [Path(ps.file).name for ps in taken]}


def last_recorded(rd, evs=None) -> dict | None:
    """What `torchdeck stacks` shows of a run that is over: the newer of its last `stacks` event
    (the watchdog's, with its reason) and the dumps its files hold; {"t", "reason", "groups",
    "files"} or None when it never took any."""
    from .. import events

    last = None
    for e in events.iter_events(rd.events_path) if evs is None else evs:  # streamed: only the last one is kept
        if isinstance(e, dict) and e.get("kind") == "stacks":
            last = e
    files = recorded(rd)
    ev_t = last.get("t") if last is not None else None
    ev_t = float(ev_t) if isinstance(ev_t, (int, float)) and not isinstance(ev_t, bool) else 0.0
    if files is not None and (last is None or files["t"] > ev_t):
        return {**files, "reason": "asked"}  # taken after the last event: `t` or `torchdeck stacks`
    if last is None:
        return None
    groups = last.get("groups") if isinstance(last.get("groups"), list) else []
    return {"t": ev_t, "reason": str(last.get("reason") or "asked"), "groups": groups,
            "files": last.get("files") if isinstance(last.get("files"), list) else []}
