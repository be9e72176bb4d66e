"""The largest batch that fits on the GPUs: `torchdeck tune PRESET --batch-size`.

Each trial is an ordinary short run of the preset at one batch size (its own supervisor and
ranks, a few optimizer steps, no evaluation), so every rank of a DDP/FSDP/ZeRO/DeepSpeed job
tries the batch at once, in fresh processes: a batch fits only if no rank ran out of memory, which
is the answer every rank agrees on by construction (an in-process finder has to agree through a
collective, and Lightning's still fails under DDP). A fresh process per trial also means no
fragmentation left by the last out-of-memory error. The price is start-up per trial.

The search grows the batch by doubling from the preset's value until a trial runs out of memory
(or the data set caps it), then bisects between the last fit and the first failure down to a
multiple of 8 (the sizes people pick for GPUs), as Lightning's `binsearch` mode does to 1.

    runs/tune-<YYYYmmdd-HHMMSS>-<preset>/
        tune.json                      every trial and the result
        <stamp>-<preset>-b<N>/         one run directory per trial (checkpoints removed)

No torch, no textual: the trials run in their own processes.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import events
from ..rundir.layout import RunDir, new_group_dir, write_atomic

RESULT_FILE = "tune.json"
OOM_WORDS = ("OutOfMemoryError", "out of memory", "CUDA_ERROR_OUT_OF_MEMORY")
FITS, OOM, CAPPED = "fits", "out of memory", "capped"


@dataclass
class Trial:
    batch: int
    outcome: str  # fits | out of memory | capped (the data set, not memory, limits it) | failed
    run: str | None = None
    peak_mem_mb: list = field(default_factory=list)  # per rank, max_memory_allocated (GPU) or RSS
    reason: str | None = None  # why it did not fit, in the run's words
    seconds: float = 0.0


def next_batch(trials: list[Trial], start: int, max_batch: int, multiple: int = 8) -> int | None:
    """The batch to try after `trials` (None: the search is over). Doubling up from `start`
    while it fits, halving down while it does not; then bisecting between the largest fit and
    the smallest failure, to a multiple of `multiple` once the fit is that large."""
    if not trials:
        return min(start, max_batch)
    fits = [t.batch for t in trials if t.outcome == FITS]
    fails = [t.batch for t in trials if t.outcome != FITS]
    lo = max(fits) if fits else 0
    hi = min(b for b in fails if b > lo) if any(b > lo for b in fails) else None
    if hi is None:  # everything so far fits: grow
        if lo >= max_batch:
            return None
        return min(lo * 2, max_batch)
    if not fits:  # even the first did not fit: shrink
        return hi // 2 if hi > 1 else None
    step = multiple if lo >= multiple else 1
    mid = (lo + hi) // 2 // step * step
    return mid if lo < mid < hi else None


def best(trials: list[Trial]) -> int | None:
    fits = [t.batch for t in trials if t.outcome == FITS]
    return max(fits) if fits else None


def is_oom(run: RunDir, final: dict | None) -> str | None:
    """The out-of-memory message of a failed trial (any rank's), or None when it failed otherwise."""
    texts = [str((final or {}).get("root_cause") or "")]
    for e in events.iter_events(run.events_path):
        if e.get("kind") == "error":
            texts.append(f"{e.get('exception', '')}: {e.get('message', '')}")
    for text in texts:
        if any(w.lower() in text.lower() for w in OOM_WORDS):
            return text.strip().splitlines()[0][:300]
    return None


def _capped(text: str) -> bool:
    return "needs more samples per rank" in text  # engine.train.TrainError: the data set is too small


def peak_mem(run: RunDir) -> list:
    """Each rank's peak memory from its rank_reports (max_memory_allocated on a GPU), as the
    shared reducer keeps it (RunView: a rank that sent no peak counts its largest device_mem_mb)."""
    from .view import RunView

    view = RunView.replay(events.iter_events(run.events_path))
    return [st.mem_high_mb for st in view.rank_list() if st.mem_high_mb is not None]


def trial_overrides(batch: int, steps: int) -> list[str]:
    return [f"train.batch_size={batch}", f"train.max_steps={steps}", "train.epochs=0",
            "train.eval_every_epoch=false", "train.log_every_n_steps=1", "train.report_every_s=0.5",
            "checkpoint.every_epoch=false", "checkpoint.every_n_steps=0", "checkpoint.resume="]


def run_trial(cfg, path: Path, origin: dict, watch=None) -> Trial:
    """One trial: the config (already at its batch) as an ordinary run under `path`."""
    from . import control

    t0 = time.monotonic()
    run = control.start(cfg, root=path, origin=origin)
    if watch is not None:
        watch(cfg.train.batch_size, run)
    final = control.wait(run) or {}
    trial = Trial(cfg.train.batch_size, FITS, run.path.name, peak_mem(run), seconds=time.monotonic() - t0)
    shutil.rmtree(run.path / "checkpoints", ignore_errors=True)  # a trial's weights are of no use
    status = final.get("status")
    if status == "finished":
        return trial
    oom = is_oom(run, final)
    cause = str(final.get("root_cause") or f"the trial ended {status or 'without a status'}")
    if oom:
        trial.outcome, trial.reason = OOM, oom
    elif _capped(cause):
        trial.outcome, trial.reason = CAPPED, cause
    else:
        trial.outcome, trial.reason = "failed", cause
    return trial


def search(preset: str, overrides: list[str] | None = None, steps: int = 3, max_batch: int = 1 << 16,
           max_trials: int = 12, root: Path | None = None, watch=None, hw=None,
           require_gpu: bool = True) -> tuple[Path, dict]:
    """Find the largest batch per process that trains `steps` steps without running out of
    memory on any rank. Returns (the tune directory, its result). UsageError before anything
    starts: the preset is invalid, or (require_gpu) it does not train on GPUs."""
    from .. import preflight
    from ..errors import UsageError
    from ..strategies import world_size

    overrides = list(overrides or [])
    base, _ = preflight.load_config(preset, overrides, hw=hw)
    if require_gpu and base.accelerator != "cuda":
        raise UsageError(
            "tune --batch-size needs GPUs (accelerator: cuda): on the CPU a larger batch does not run out "
            "of memory, it only takes longer and swaps",
            "to see what a batch needs on the CPU: torchdeck validate PRESET --memory")
    if steps < 1:
        raise UsageError("--steps: at least 1 optimizer step per trial")
    if max_batch < 1:
        raise UsageError("--max-batch: at least 1")
    problems = preflight.check(base)
    if problems:
        raise UsageError(*preflight.lines(problems))
    path = new_group_dir("tune", base.name, root)
    trials: list[Trial] = []
    result = {"version": 1, "preset": preset, "overrides": overrides, "start": base.train.batch_size,
              "world": world_size(base), "steps_per_trial": steps, "trials": trials, "best": None,
              "stopped_by": None}

    def save() -> None:
        data = dict(result, trials=[asdict(t) for t in trials])
        write_atomic(path / RESULT_FILE, json.dumps(data, indent=2))

    origin = {"preset": preset, "overrides": overrides, "tune": str(path)}
    while len(trials) < max_trials:
        batch = next_batch(trials, base.train.batch_size, max_batch)
        if batch is None or batch < 1:
            break
        cfg, _ = preflight.load_config(preset, overrides + trial_overrides(batch, steps)
                                       + [f"name={base.name}-b{batch}"], hw=hw)
        trial = run_trial(cfg, path, origin, watch)
        trials.append(trial)
        save()
        if trial.outcome == "failed":
            result["stopped_by"] = f"batch {batch}: {trial.reason}"
            break
    else:
        result["stopped_by"] = f"--max-trials {max_trials} reached"
    if result["stopped_by"] is None and best(trials) == max_batch:
        result["stopped_by"] = f"--max-batch {max_batch} fits"
    result["best"] = best(trials)
    save()
    return path, dict(result, trials=trials)


def lines(result: dict) -> list[str]:
    """The trials and the result as `torchdeck tune` prints them."""
    out = []
    for t in result["trials"]:
        t = t if isinstance(t, Trial) else Trial(**t)
        peak = "/".join(f"{m:,.0f}" for m in t.peak_mem_mb)
        what = {FITS: "fits", OOM: "out of memory", CAPPED: "capped by the data"}.get(t.outcome, "failed")
        out.append(f"batch {t.batch:>6}  {what:<18} {('peak ' + peak + ' MiB/rank') if peak and t.outcome == FITS else ''}"
                   f"{'' if t.outcome == FITS else ' ' + (t.reason or '')}".rstrip())
    b = result.get("best")
    if result.get("stopped_by"):
        out.append(f"stopped: {result['stopped_by']}")
    if b is None:
        out.append("no batch size fits: even the smallest tried ran out of memory")
    else:
        gb = b * (result.get("world") or 1)
        out.append(f"largest batch that fits: {b} per process ({gb} global over {result.get('world')} process(es)); "
                   f"the preset has {result.get('start')}")
    return out
