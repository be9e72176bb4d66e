"""Strategies side by side: one job run under several strategies, one after another, and the
numbers that tell them apart, computed once from the runs' events for `torchdeck compare` and
the app's Compare screen alike.

A comparison directory groups the runs (each an ordinary run directory):

    runs/compare-<YYYYmmdd-HHMMSS>-<preset>/
        compare.json     the plan: what was held equal, one entry per strategy (its run or why skipped)
        compare.md       the table, written when the last run ends
        <stamp>-<preset>-<strategy>/   one run directory per strategy that ran

What is held equal: the preset's model, data, seed, optimizer and learning rate, and the global
batch (each strategy's per-process batch is the global batch over its processes). What differs:
strategy, accelerator, devices and backend. Rates leave out warm-up: the first logged window of
each rank (start-up, first iterations, allocator growth) is not counted.
No torch, no textual: the app reads comparisons on its event loop.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import events
from ..kinds import kind_of
from .. import fmt
from . import metric
from ..rundir.layout import COMPARISON_FILE, RunDir, new_group_dir, pid_alive, write_atomic
from .view import RunView
from ..strategies import get_strategy, global_batch, loop_names, world_size

PLAN_FILE, TABLE_FILE = COMPARISON_FILE, "compare.md"
ALL_STRATEGIES = tuple(loop_names())  # the strategies say which they are (engine.strategies)
SKIPPED = "skipped"
JOB_FILE, LOG_FILE, STOP_FILE = "job.yaml", "compare.log", "stop"  # beside compare.json


# ----------------------------------------------------------------------------- the numbers


@dataclass
class Row:
    """One strategy's line of the table; None where the run did not say (yet)."""

    strategy: str
    status: str  # starting | running | finished | failed | stopped | lost | skipped | waiting
    run: str | None = None  # the run directory (absolute path)
    world: int | None = None
    global_batch: int | None = None
    samples_per_s: float | None = None  # global, warm-up left out
    ratio: float | None = None  # samples_per_s over the baseline's (the first row with a rate)
    step_s: float | None = None  # seconds per optimizer step, warm-up left out
    data_wait: float | None = None  # share of the step time the ranks waited for batches
    peak_mem_mb: list = field(default_factory=list)  # per rank, in rank order
    mem_kind: str = "RSS"  # RSS (CPU) or allocated (GPU)
    time_to_target_s: float | None = None  # from the run's start to the first eval at the target
    final_val_acc: float | None = None
    main: str | None = None  # its main validation metric (metric.main_of): val_acc, val_loss; None: no eval yet
    final_main: float | None = None  # that metric's newest value
    tokens_per_s: float | None = None  # global, warm-up left out; None: its batches carry no token ids
    steps: int = 0
    warmup_steps: int = 0
    reason: str | None = None  # why it was skipped, or the root cause of a failure
    label: str = ""  # how the table and the legend name it, when the strategy alone does not (tell_apart)

    @property
    def name(self) -> str:
        return self.label or self.strategy

    def cells(self, target=None) -> dict[str, str]:
        """The row as words, the same in the CLI, compare.md and the app."""
        mem = self.peak_mem_mb
        if not mem:
            mem_s = "-"
        elif len(mem) <= 4:
            mem_s = "/".join(f"{m:.0f}" for m in mem) + f" MiB {self.mem_kind}"
        else:
            mem_s = f"max {max(mem):.0f} MiB {self.mem_kind} ({len(mem)} ranks)"
        return {
            "strategy": self.name,
            "status": self.status,
            "world": "-" if self.world is None else str(self.world),
            "batch": "-" if self.global_batch is None else str(self.global_batch),
            "rate": fmt.rate(self.samples_per_s),
            "tokens": fmt.rate(self.tokens_per_s),
            "ratio": "-" if self.ratio is None else f"{self.ratio:.2f}x",
            "step": "-" if self.step_s is None else f"{1000 * self.step_s:.1f} ms",
            "wait": fmt.pct(self.data_wait),
            "mem": mem_s,
            "target": (fmt.duration(self.time_to_target_s) if self.time_to_target_s is not None
                       else "not reached" if target is not None and self.run and self.main is not None
                       else "-"),
            "val": metric.show(self.main or metric.ACC, self.final_main),
        }


def columns(target=None, rows=None) -> tuple[tuple[str, str], ...]:
    """The table's columns: TOKENS/S where a row counts tokens, the target as given (`TO 90%` for
    an accuracy, `TO val_loss<=1.6`), and the main metric's name (VAL ACC, VAL LOSS)."""
    rows = list(rows or [])
    target = None if target is None else metric.parse_target(target)
    val = metric.column_label(r.main for r in rows)
    tokens = (("tokens", "TOKENS/S"),) if any(r.tokens_per_s for r in rows) else ()
    return (("strategy", "STRATEGY"), ("status", "STATUS"), ("world", "WORLD"), ("batch", "GLOBAL BATCH"),
            ("rate", "SAMPLES/S"), *tokens, ("ratio", "VS FIRST"), ("step", "STEP"), ("wait", "DATA WAIT"),
            ("mem", "PEAK MEM/RANK"), ("target", "TO " + (target.short if target is not None else "TARGET")),
            ("val", val))


def _view(rd: RunDir) -> RunView:
    """The run as the one reducer sees it: its events replayed, then what its directory says of
    its processes (a live run, a lost one)."""
    from .follow import Follower  # its view checkpoint and the events after it, not every event

    view = Follower(rd, outputs=False, history=False).read()
    final = rd.final_status()
    pid = rd.owner_pid()
    view.observe(final, final is None and pid_alive(pid), pid is not None, rd.quiet_s(), time.time())
    return view


def measure(run, strategy: str | None = None, target=None) -> Row:
    """One run's row, from its events and status files. The rate is the global batch over the
    time per optimizer step of the lowest rank, summed over its logged windows after the first
    (each step event covers the steps since the one before; evaluation is not in any window)."""
    rd = run if isinstance(run, RunDir) else RunDir(Path(run))
    view = _view(rd)
    row = Row(strategy=strategy or view.strategy, status=str(view.status), run=str(rd.path),
              world=view.world_size or None, global_batch=view.global_batch, reason=view.root_cause)
    if row.global_batch is None or row.world is None:
        try:
            cfg = rd.config()
            row.global_batch, row.world = row.global_batch or global_batch(cfg), row.world or world_size(cfg)
            row.strategy = strategy or cfg.strategy
        except Exception:  # an unreadable config: the events' figures (or none) stand
            pass
    row.mem_kind = "allocated" if any(str(d).startswith("cuda") for d in view.devices) else "RSS"
    ranks = view.rank_list()
    row.peak_mem_mb = [round(r.mem_high_mb, 1) for r in ranks if r.mem_high_mb is not None]
    row.warmup_steps = next((r.warmup_steps for r in ranks if r.warmup_steps is not None), 0)
    row.steps = view.progress()[0]
    timed = [r for r in ranks if r.timed_steps > 0]
    if timed:
        lead = timed[0]
        if lead.timed_s > 0:
            row.step_s = lead.timed_s / lead.timed_steps
            if row.global_batch:
                row.samples_per_s = row.global_batch / row.step_s
        total = sum(r.timed_s for r in timed)
        row.data_wait = sum(r.timed_wait_s for r in timed) / total if total > 0 else None
    per_sample = [r.mean_tokens_per_s / r.mean_samples_per_s for r in ranks
                  if r.mean_tokens_per_s > 0 and r.mean_samples_per_s > 0]
    if per_sample and row.samples_per_s:  # tokens per sample as the ranks counted them, at the row's rate
        row.tokens_per_s = row.samples_per_s * sum(per_sample) / len(per_sample)
    row.final_val_acc = view.latest_val_acc()
    main = view.main()
    if main is not None:
        row.main, row.final_main = main[0], main[1]
    row.time_to_target_s = None if target is None else view.reached(target)
    return row


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row's rate over the baseline's: the first row that has a rate."""
    base = next((r.samples_per_s for r in rows if r.samples_per_s), None)
    for r in rows:
        r.ratio = r.samples_per_s / base if base and r.samples_per_s else None
    return rows


@dataclass
class Curve:
    """One run's curves for overlaying: (step, seconds since its start, value)."""

    label: str
    loss: list = field(default_factory=list)
    val_acc: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)


def curves(run, label: str | None = None) -> Curve:
    """Training loss (the lowest rank's step events), validation accuracy and loss (epoch ends)."""
    rd = run if isinstance(run, RunDir) else RunDir(Path(run))
    view = RunView.replay(events.iter_events(rd.events_path), timed=True)
    losses = view.timed_losses()
    accs = [(p.step, p.t, p.val_acc) for _, p in sorted(view.epochs.items())
            if p.rank in (0, -1) and p.val_acc is not None and p.t is not None]
    vloss = [(p.step, p.t, p.val_loss) for _, p in sorted(view.epochs.items())
             if p.rank in (0, -1) and p.val_loss is not None and p.t is not None]
    start = view.started_t
    if start is None:  # no run_started event: the first point's time
        start = min([t for _, t, _ in losses[:1] + accs[:1]], default=0.0)
    c = Curve(label or rd.short_name)
    c.loss = [(step, t - start, loss) for step, t, loss in losses]
    c.val_acc = [(step, t - start, acc) for step, t, acc in accs]
    c.val_loss = [(step, t - start, v) for step, t, v in vloss]
    return c


# ----------------------------------------------------------------------------- a comparison on disk


@dataclass
class Comparison:
    """A comparison directory read back: its plan and its rows, as they stand now."""

    path: Path
    plan: dict
    rows: list

    @property
    def target(self) -> metric.Target | None:
        return plan_target(self.plan)

    def header(self) -> list[str]:
        return header_lines(self.plan)

    @property
    def error(self) -> str | None:
        """Why the comparison was stopped for the user to fix (a target no run reports)."""
        e = self.plan.get("error")
        return e if isinstance(e, str) and e else None


def plan_target(plan: dict) -> metric.Target | None:
    """A plan's target: its `target` text (val_loss<=1.6), or the `target_acc` of older plans."""
    for value in (plan.get("target"), fmt.real(plan.get("target_acc"))):
        if value is not None:
            try:
                return metric.parse_target(value)
            except Exception:  # a hand-edited plan: no target rather than no table
                continue
    return None


def read_plan(path) -> dict:
    try:
        data = json.loads((Path(path) / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(path) -> Comparison:
    """The rows of a comparison directory, measured now from its runs (a live one too)."""
    path = Path(path)
    plan = read_plan(path)
    target = plan_target(plan)
    rows = []
    for e in plan.get("entries") or []:
        if not isinstance(e, dict):
            continue
        strategy = str(e.get("strategy", "?"))
        if e.get("skipped"):
            rows.append(Row(strategy, SKIPPED, reason=str(e["skipped"]), world=e.get("world"),
                            global_batch=e.get("global_batch")))
        elif e.get("run") and (path / e["run"] / "config.yaml").is_file():
            rows.append(measure(path / e["run"], strategy, target))
        elif e.get("run"):
            rows.append(Row(strategy, "deleted", reason=f"its run directory {e['run']} is gone", world=e.get("world"),
                            global_batch=e.get("global_batch")))
        else:
            rows.append(Row(strategy, "waiting", world=e.get("world"), global_batch=e.get("global_batch")))
    return Comparison(path, plan, tell_apart(with_ratios(rows)))


def of_runs(paths, target=None) -> list[Row]:
    """Rows for runs picked by hand (the Runs list's marks), in the order given; runs of the same
    strategy are told apart (tell_apart)."""
    return tell_apart(with_ratios([measure(p, None, target) for p in paths]))


def tell_apart(rows: list[Row]) -> list[Row]:
    """Labels for rows that the strategy alone does not tell apart, the same in the app's table
    and legend and in `torchdeck compare`: a strategy that repeats adds the run's name, and a
    strategy and name that still repeat add the run's start time (its directory's stamp:
    hh:mm:ss, with the date when they started on different days), or else the directory's name."""
    def repeats(key) -> list[list[Row]]:
        groups: dict = {}
        for r in rows:
            if r.run:
                groups.setdefault(key(r), []).append(r)
        return [g for g in groups.values() if len(g) > 1]

    for group in repeats(lambda r: r.strategy):
        for r in group:
            r.label = f"{r.strategy} {RunDir(Path(r.run)).short_name}"
    for group in repeats(lambda r: r.name):
        stamps = [RunDir(Path(r.run)).stamp_time for r in group]
        days = {time.strftime("%Y%m%d", time.localtime(t)) for t in stamps if t is not None}
        for r, t in zip(group, stamps):
            when = (RunDir(Path(r.run)).name if t is None
                    else time.strftime("%H:%M:%S" if len(days) == 1 else "%m-%d %H:%M", time.localtime(t)))
            r.label = f"{r.name} {when}"
    return rows


def header_lines(plan: dict) -> list[str]:
    eq = plan.get("held_equal") or {}
    lines = [f"comparison of {plan.get('preset', '?')}" + (f" with --set {' '.join(plan['overrides'])}"
                                                           if plan.get("overrides") else "")]
    if eq:
        lines.append("held equal: " + ", ".join(f"{k} {v}" for k, v in eq.items()))
    lines.append("each strategy runs alone, one after another; rates leave out warm-up (each rank's first "
                 "logged window)")
    return lines


# Columns left out first when the table is wider than the terminal (compare.md keeps them all):
# the global batch is held equal (the header says so), then the diagnostic columns (step time,
# data wait, memory); the target's column (the user asked for it) and the task's throughput unit
# go last (at 80 columns the target went third while DATA WAIT stayed).
NARROW_DROP = ("batch", "world", "step", "wait", "mem", "target")


def narrow_drop(rows) -> tuple[str, ...]:
    """NARROW_DROP; where the rows count tokens (a language model), TOKENS/S is the task's unit:
    SAMPLES/S goes before the target and TOKENS/S last."""
    if not any(r.tokens_per_s for r in rows):
        return NARROW_DROP
    i = NARROW_DROP.index("target")
    return NARROW_DROP[:i] + ("rate",) + NARROW_DROP[i:] + ("tokens",)


def table_lines(rows: list[Row], target=None, width: int | None = None) -> list[str]:
    """The table as aligned text, then one line per skipped or failed row saying why. With a
    width (a terminal's), columns are left out until a row fits on one line."""
    out = fmt.fit_table(list(columns(target, rows)), [r.cells(target) for r in rows], width, narrow_drop(rows), TABLE_FILE)
    out += [f"{r.name}: {r.status}: {r.reason}" for r in rows if r.reason]
    return out


def markdown(comparison: Comparison) -> str:
    cols = columns(comparison.target, comparison.rows)
    lines = [f"# {comparison.header()[0]}", ""] + [ln for ln in comparison.header()[1:]] + [""]
    lines.append("| " + " | ".join(label for _, label in cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in comparison.rows:
        c = r.cells(comparison.target)
        lines.append("| " + " | ".join(c[k] for k, _ in cols) + " |")
    why = [f"- {r.name} ({r.status}): {r.reason}" for r in comparison.rows if r.reason]
    if why:
        lines += [""] + why
    runs = [f"- {r.name}: `{r.run}`" for r in comparison.rows if r.run]
    if runs:
        lines += ["", "Runs:"] + runs
    return "\n".join(lines) + "\n"


def write_results(comparison: Comparison) -> None:
    """compare.json gains the rows as measured; compare.md is the table for people."""
    plan = dict(comparison.plan)
    plan["rows"] = [asdict(r) for r in comparison.rows]
    write_atomic(comparison.path / PLAN_FILE, json.dumps(plan, indent=2))
    write_atomic(comparison.path / TABLE_FILE, markdown(comparison))


def fastest(comparison: Comparison) -> Row | None:
    """The fastest finished row that reached the target (any finished row without a target)."""
    target = comparison.target
    ok = [r for r in comparison.rows if r.status == "finished" and r.samples_per_s
          and (target is None or r.time_to_target_s is not None)]
    return max(ok, key=lambda r: r.samples_per_s) if ok else None


# ----------------------------------------------------------------------------- planning


@dataclass
class Entry:
    """One strategy of a plan: the config it runs, or why this host cannot run it."""

    strategy: str
    cfg: object = None  # RunConfig with the comparison's limits (steps or epochs)
    preset_cfg: object = None  # the same without them: what --save-best saves
    skipped: str | None = None


def _first_problem(problems) -> str:
    problems = sorted(problems, key=lambda p: p[0] != "accelerator")  # "no GPU here" says it best
    f, why = problems[0]
    return f"{f}: {why}" if f else why


def plan(preset: str, strategies: list[str], overrides: list[str] | None = None, steps: int | None = None,
         epochs: int | None = None, hw=None, target=None) -> tuple[dict, list[Entry]]:
    """What a comparison would run: (the plan's header facts, one Entry per strategy). The preset
    with `overrides` must itself be valid, and `target` name a metric its runs report (ConfigError,
    UsageError otherwise: nothing starts);
    a strategy this host cannot run, or whose config the preflight refuses, is an Entry with the
    reason it is skipped."""
    from .. import preflight
    from ..errors import UsageError

    bad = [s for s in strategies if s not in ALL_STRATEGIES]
    if bad or not strategies:
        raise UsageError(f"--strategies: unknown {', '.join(bad)}; pick from {', '.join(ALL_STRATEGIES)}"
                         if bad else "--strategies: name at least one strategy")
    if steps is not None and epochs is not None:
        raise UsageError("give --steps or --epochs, not both")
    if hw is None:
        from ..hardware import detect_hardware

        hw = detect_hardware()
    overrides = list(overrides or [])
    base, path = preflight.load_config(preset, overrides, hw=hw)
    if kind_of(base).is_script:  # the app's F7 says the same (its global batch is None: it crashed here)
        raise UsageError(kind_of(base).does_not_apply("compare", "the strategies are torchdeck's own training "
                                                      "loop's, and your script does its own distributed setup"))
    problems = preflight.file_problems(base)
    if problems:
        raise UsageError(*preflight.lines(problems, str(path), overrides))
    if target is not None:
        try:
            metric.check_target_metric(metric.parse_target(target), metric.may_report_own(base))
        except UsageError as exc:
            raise UsageError(f"--target: {exc}") from None
    limits = _length_overrides(base, steps, epochs)
    gb = global_batch(base)
    entries = []
    for s in strategies:
        common = overrides + [f"strategy={s}", "backend=auto", f"name={base.name}-{s}"] + get_strategy(s).placement(base)
        entries.append(_entry(preset, s, common, gb, limits, hw))
    limit = (f"{steps} steps" if steps is not None else f"{epochs} epoch(s)" if epochs is not None
             else (f"{base.train.max_steps} steps" if base.train.max_steps else f"{base.train.epochs} epoch(s)"))
    facts = {
        "version": 1, "preset": preset, "name": base.name, "overrides": overrides, "strategies": list(strategies),
        "held_equal": {"model": base.model.name, "data": base.data.dataset, "seed": base.train.seed,
                       "global batch": gb, "optimizer": base.optimizer.name, "lr": f"{base.optimizer.lr:g}",
                       "precision": base.train.precision, "length": limit},
    }
    return facts, entries


def _length_overrides(base, steps: int | None, epochs: int | None) -> list[str]:
    """The --set lines that give every strategy's run the comparison's length (none: the preset's)."""
    from ..errors import UsageError

    if steps is not None:
        if steps < 2:
            raise UsageError("--steps: at least 2 (the first logged steps are warm-up)")
        log_every = max(1, min(base.train.log_every_n_steps, steps // 8))
        return [f"train.max_steps={steps}", "train.epochs=0", f"train.log_every_n_steps={log_every}"]
    if epochs is not None:
        if epochs < 1:
            raise UsageError("--epochs: at least 1")
        return [f"train.epochs={epochs}", "train.max_steps=0"]
    return []


def _entry(preset: str, s: str, common: list[str], gb: int, limits: list[str], hw) -> Entry:
    """One strategy's Entry (`common`: its overrides and placement): its config with the global
    batch held (per process: gb / (world x accumulation)), or why it is skipped."""
    from .. import config as cfgmod
    from .. import preflight

    try:
        probe, _ = preflight.load_config(preset, common, hw=hw)
        split = world_size(probe) * probe.train.grad_accum
        if gb % split:
            return Entry(s, skipped=f"the global batch {gb} does not split evenly over {world_size(probe)} "
                                    f"process(es) x accumulation {probe.train.grad_accum}")
        common = common + [f"train.batch_size={gb // split}"]
        cfg, _ = preflight.load_config(preset, common + limits, hw=hw)
        keep, _ = preflight.load_config(preset, common, hw=hw)
    except cfgmod.ConfigError as exc:
        return Entry(s, skipped=_first_problem(exc.problems))
    problems = preflight.check(cfg)
    if problems:
        return Entry(s, skipped=_first_problem(problems))
    return Entry(s, cfg, keep)


def new_dir(preset_name: str, root: Path | None = None) -> Path:
    """runs/compare-<time>-<preset>/, unique."""
    return new_group_dir("compare", preset_name, root)


def write_plan(path: Path, facts: dict, entries: list[Entry], target) -> dict:
    """compare.json's plan. The target is kept as its text (`target`: val_loss<=1.6) and, for an
    accuracy target, also as `target_acc`, the number older readers know."""
    target = None if target is None else metric.parse_target(target)
    acc = target.value if target is not None and target.name == metric.ACC and target.op == ">=" else None
    data = dict(facts, target=None if target is None else target.text, target_acc=acc, created=time.time(), entries=[
        {"strategy": e.strategy, "run": None, "skipped": e.skipped,
         "world": world_size(e.cfg) if e.cfg is not None else None,
         "global_batch": global_batch(e.cfg) if e.cfg is not None else None} for e in entries])
    write_atomic(path / PLAN_FILE, json.dumps(data, indent=2))
    return data


def record_run(path: Path, strategy_index: int, run: RunDir) -> None:
    """The plan learns which run directory a strategy got, as soon as it starts."""
    data = read_plan(path)
    data["entries"][strategy_index]["run"] = run.path.name
    write_atomic(path / PLAN_FILE, json.dumps(data, indent=2))


class TargetMetricCheck:
    """Whether a run reports the metric a target names, judged at its first evaluated epoch_end
    (or its first epoch_end for a train_ metric): a loss callable's own names are known only once
    it ran, and a target no run reports ran every strategy to its end to say `not reached`.
    Reads the events file on from where it stopped, so a poll costs what was written since."""

    def __init__(self, events_path, target: metric.Target):
        self.path, self.target = Path(events_path), target
        self.offset, self.lines = 0, events.Lines()
        self.missing: str | None = None  # the error, once the metric is known to be missing
        self.done = False

    def poll(self) -> str | None:
        if self.done:
            return self.missing
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(events.CHUNK_BYTES)
        except OSError:
            return None
        self.offset += len(chunk)
        for raw in self.lines.split(chunk):
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("kind") == "epoch_end" and self._judge(ev):
                break
        return self.missing

    def _judge(self, ev: dict) -> bool:
        from types import SimpleNamespace

        val = ev.get("val_metrics") if isinstance(ev.get("val_metrics"), dict) else {}
        train = ev.get("train_metrics") if isinstance(ev.get("train_metrics"), dict) else {}
        point = SimpleNamespace(val_loss=ev.get("val_loss"), val_acc=ev.get("val_acc"), train_loss=ev.get("train_loss"),
                                train_acc=ev.get("train_acc"), val_metrics=val, train_metrics=train)
        evaluated = point.val_loss is not None or point.val_acc is not None or bool(val)
        if not evaluated and not self.target.name.startswith("train_"):
            return False  # no evaluation this epoch: the next one says
        self.done = True
        if metric.point_value(point, self.target.name) is not None:
            return True
        names = [n for n in ("val_loss", "val_acc") if getattr(point, n) is not None] + [f"val_{k}" for k in val]
        names += [n for n in ("train_loss", "train_acc") if getattr(point, n) is not None]
        names += [f"train_{k}" for k in train]
        self.missing = (f"--target {self.target.text}: the run reports no metric {self.target.name!r} (its first "
                        f"epoch reported {', '.join(names) or 'none'}); the comparison was stopped: "
                        "pick one of those")
        return True


def execute(path: Path, facts: dict, entries: list[Entry], watch=None, stopping=lambda: False) -> Comparison:
    """Run the plan's strategies one after another (never two at once: they would share the CPU
    and the rates would say nothing), then write the results. watch(index, run) follows a run
    until it ends (the CLI draws it); without it, this waits. The comparison stops (the running
    strategy gracefully, the rest never start) when stopping() is true or its stop file appears
    (`request_stop`: the app's Compare screen)."""
    import threading

    from . import control

    stop_file = path / STOP_FILE
    current: list = []
    done = threading.Event()
    target = plan_target(read_plan(path))
    checks: list[TargetMetricCheck] = []  # the first run's: every strategy runs the same task

    def guard() -> None:
        while not done.wait(0.3):
            if current and target is not None and not checks:
                checks.append(TargetMetricCheck(current[0].events_path, target))
            if checks and checks[0].poll() and not stop_file.exists():
                stop_file.touch()  # the plan learns why once the loop is over (one writer of compare.json)
            if current and stop_file.exists() and not current[-1].stop_path.exists():
                control.request_stop(current[-1])

    threading.Thread(target=guard, name="compare-stop", daemon=True).start()
    try:
        for i, e in enumerate(entries):
            if e.skipped:
                continue
            if stopping() or stop_file.exists():
                data = read_plan(path)
                data["entries"][i]["skipped"] = "not run: the comparison was stopped"
                write_atomic(path / PLAN_FILE, json.dumps(data, indent=2))
                continue
            origin = {"preset": facts.get("preset"), "overrides": list(facts.get("overrides") or []),
                      "comparison": str(path)}
            run = control.start(e.cfg, root=path, origin=origin)
            current.append(run)
            record_run(path, i, run)
            if watch is not None:
                watch(i, run)
            control.wait(run)
    finally:
        done.set()
    if checks and checks[0].missing:
        data = read_plan(path)
        data["error"] = checks[0].missing
        write_atomic(path / PLAN_FILE, json.dumps(data, indent=2))
    comparison = load(path)
    write_results(comparison)
    return comparison


# ----------------------------------------------------------------------------- in the background (the app)



def launch(job, strategies: list[str], steps: int | None = None, epochs: int | None = None,
           target=None, root: Path | None = None, hw=None) -> Path:
    """Start a comparison of the config `job` that outlives the caller (the app): the plan is made
    here, so a refusal is an exception and nothing starts; then `python -m torchdeck.engine.runs.compare DIR`
    runs it in its own session. Returns the comparison directory."""
    import shutil
    import subprocess
    import sys
    import threading

    from .. import config as cfgmod

    path = new_dir(job.name, root)
    try:
        cfgmod.save(job, path / JOB_FILE)
        facts, entries = plan(str(path / JOB_FILE), strategies, [], steps, epochs, hw=hw)
    except Exception:
        shutil.rmtree(path, ignore_errors=True)
        raise
    facts.update(preset=job.name, job=JOB_FILE, steps=steps, epochs=epochs)
    write_plan(path, facts, entries, target)
    with open(path / LOG_FILE, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "torchdeck.engine.runs.compare", str(path)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return path


def request_stop(path) -> None:
    """No further strategy starts; the one running now stops gracefully (it checkpoints)."""
    (Path(path) / STOP_FILE).touch()


def _run_detached(path: Path) -> int:
    """The body of `python -m torchdeck.engine.runs.compare DIR`: the plan written by `launch`, run."""
    facts = read_plan(path)
    _, entries = plan(str(path / facts.get("job", JOB_FILE)), list(facts.get("strategies") or []), [],
                      facts.get("steps"), facts.get("epochs"))
    comparison = execute(path, facts, entries)
    print("\n".join(table_lines(comparison.rows, comparison.target)), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_run_detached(Path(sys.argv[1])))
