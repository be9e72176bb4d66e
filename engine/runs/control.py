"""Control of a run from outside: start its supervisor detached, stop it, kill it, wait for it,
and find every process it owns.

The supervisor runs in a new session (its pid is the session id), so the run outlives the app,
the CLI and an SSH drop, and every process of the run (spawned ranks, data loader workers)
can be found by that session id even after the supervisor itself is gone.
No torch here: the app calls this from its event loop.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ..procs import module_argv
from ..rundir.layout import RunDir
from ..rundir.status import Status


def start(cfg, root: str | os.PathLike | None = None, origin: dict | None = None) -> RunDir:
    """Create the run directory and start `python -m torchdeck.engine.supervisor RUN_DIR` in its own session.
    `origin` ({"preset", "overrides"}) is kept beside the config, to tell runs apart later."""
    # where it was started from: the run's own code (model.name: mod:fn) is looked up there
    # later too, by `torchdeck eval` run elsewhere (engine.usercode)
    origin = {"cwd": os.getcwd(), **(origin or {})}
    run = RunDir.create(cfg, Path(root) if root else None, origin)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(run.supervisor_log, "ab") as log:
        proc = subprocess.Popen(
            module_argv("torchdeck.engine.supervisor", str(run.path)),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
        )
    # The supervisor writes this too; writing it now means stop/kill work from the first moment
    # (unless it has already ended: then its pid file is gone for good).
    if not run.pid_path.exists() and run.final_status() is None:
        run.write_pid(proc.pid)
    # Reap it when it ends, so a finished supervisor is not a zombie that still looks alive.
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return run


def resume_point(run) -> tuple[int, Path]:
    """(step, checkpoint) a run would resume from: its newest checkpoint; UsageError if it has none
    or is still going."""
    from ..errors import UsageError
    from ..kinds import kind_of_run

    run = _as_run(run)
    kind = kind_of_run(run)  # a script's checkpoints are its own: "no checkpoint yet" would mislead
    if not kind.can_resume:
        raise UsageError(kind.does_not_apply("resume", kind.no_resume, run.name))
    status = run.status()
    if status.live:
        raise UsageError(f"run {run.name} is {status}: stop it first (torchdeck stop {run.name}), or "
                         "watch it (torchdeck attach)")
    found = run.newest_checkpoint()
    if found is None:
        raise UsageError(f"run {run.name} has no checkpoint to resume from (it ended before its first one; "
                         "checkpoint.every_n_steps and checkpoint.every_epoch set how often they are written)")
    return found


def checkpoint_position(run, step: int, ckpt: Path) -> tuple[int | None, int | None]:
    """(epoch index, batches done) of a run's checkpoint at `step`, from its `checkpoint` event
    (torch-free: the app asks from its event loop); (None, None) when the events do not say."""
    from .catalog import read_head_tail
    from .follow import iter_events

    def find(evs):
        hit = None
        for ev in evs:
            if ev.get("kind") == "checkpoint" and ev.get("rank") in (0, None) and ev.get("step") == step:
                hit = ev
        return hit

    run = _as_run(run)
    ev = find(read_head_tail(run.events_path)[1]) or find(iter_events(run.events_path))  # the tail: nearly always
    if ev is None:
        return None, None
    epoch, done = ev.get("epoch"), ev.get("batches_done")
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    return (epoch if ok(epoch) else None), (done if ok(done) else None)


def nothing_left(cfg, step: int, epoch: int | None, batches_done: int | None = None) -> str | None:
    """Why a run resumed at this position would train nothing under `cfg` (its length is already
    done), or None when it has steps left. `epoch` is the engine's 0-based index (as events and
    checkpoints carry it; at an epoch's end, the epochs done). The one rule `torchdeck resume`,
    `torchdeck run --resume` and the app's Resume all apply before they create anything."""
    from ..fmt import epoch_at

    t = cfg.train
    ends, raise_ = [], []
    if t.max_steps and step >= t.max_steps:
        ends.append(f"train.max_steps={t.max_steps}")
        raise_.append(f"--set train.max_steps=N (N > {step})")
    if t.epochs and epoch is not None and epoch >= t.epochs:
        ends.append(f"train.epochs={t.epochs}")
        raise_.append(f"--set train.epochs=K (K > {epoch})")
    if not ends:
        return None
    if batches_done is None and epoch is not None:  # a run from before checkpoint events said it
        batches_done = 0 if t.epochs and epoch >= t.epochs else 1  # train.epochs ends only at an epoch's end
    where = f"{epoch_at(epoch, batches_done)}, " if epoch is not None else ""
    return (f"nothing left to train: its checkpoint is at {where}step {step}, where {' and '.join(ends)} "
            f"end{'s' if len(ends) == 1 else ''} the run; raise {'it' if len(ends) == 1 else 'both'}: "
            + " ".join(raise_))


def check_left(run, cfg, step: int, ckpt: Path) -> None:
    """UsageError (exit 2, nothing created) when resuming `run` from `ckpt` under `cfg` would train nothing."""
    from ..errors import UsageError

    epoch, done = checkpoint_position(run, step, ckpt)
    why = nothing_left(cfg, step, epoch, done)
    if why:
        raise UsageError(f"run {_as_run(run).name} cannot be resumed from {Path(ckpt).name}: {why}")


def resume_origin(run, ckpt: Path, overrides: list[str] | None = None) -> dict:
    """origin.json of a run that continues `run` from `ckpt`: the same preset and --set values (and
    any new ones), and where it came from, so its curves can continue the old ones."""
    run = _as_run(run)
    old = run.origin()
    before = [str(o) for o in old.get("overrides") or [] if isinstance(o, str)]
    return {"preset": old.get("preset") or str(run.config_path), "overrides": before + list(overrides or []),
            "resumed_from": str(run.path), "checkpoint": str(ckpt),
            **({"cwd": old["cwd"]} if isinstance(old.get("cwd"), str) else {})}  # its preset is relative to it


def resume_config(run, overrides: list[str] | None = None):
    """What resuming `run` would start: its config with `overrides` applied and checkpoint.resume
    at its newest checkpoint, checked as any launch is and refused when it would train nothing
    (TorchdeckError with the reasons otherwise). Returns (cfg, origin, step, checkpoint); `start(cfg, run.path.parent, origin)`
    launches it. The CLI's `torchdeck resume` and the app's Resume both come here."""
    from .. import preflight
    from ..errors import UsageError

    run = _as_run(run)
    step, ckpt = resume_point(run)
    cfg, _ = preflight.load_config(str(run.config_path), list(overrides or []) + [f"checkpoint.resume={ckpt}"])
    problems = preflight.check(cfg)
    if problems:
        raise UsageError(*preflight.lines(problems, str(run.config_path)))
    check_left(run, cfg, step, ckpt)
    return cfg, resume_origin(run, ckpt, overrides), step, ckpt


def _as_run(run) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(Path(run))


def request_stop(run) -> None:
    """Graceful stop: ranks finish the step, rank 0 checkpoints. The supervisor polls this file."""
    run = _as_run(run)
    run.stop_path.touch()


def _session_id(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def run_processes(run) -> list[psutil.Process]:
    """Every live process of the run: the supervisor's session (ranks inherit it), or for a run
    under torchrun, its agent and everything below it."""
    run = _as_run(run)
    sid = run.supervisor_pid()
    if sid is None:
        return _launcher_tree(run.launcher_pid())
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if p.pid == sid or _session_id(p.pid) == sid:
            out.append(p)
    return out


def _launcher_tree(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        top = psutil.Process(pid)
        procs = [top] + top.children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def kill(run) -> list[int]:
    """SIGKILL every process of the run; record it as stopped, killed (the user's choice, not a
    failure: not red anywhere; `torchdeck launch`/`run` exit 130), unless it recorded how it
    ended first. Returns pids."""
    run = _as_run(run)
    if run.slurm is not None:  # its processes are on the job's nodes: SLURM ends them
        return cancel_job(run)
    sid = run.supervisor_pid()
    killed = []
    procs = run_processes(run)  # before the group kill: after it they are gone or zombies
    if sid is not None:
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            pass
    for p in procs:  # the supervisor's session, or torchrun's agent (first: it restarts no one) and below
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:
            continue
        killed.append(p.pid)
    if run.final_status() is None:
        run.write_final(Status.STOPPED, "killed by the user (SIGKILL to every process of the run)", killed=True)
    return killed


SLURM_STOP_GRACE_S = 120.0  # a SLURM run asked to stop is cancelled if it has not ended by then (a checkpoint
# of a large model on a busy shared filesystem takes minutes; a script run's own grace is added)


def cancel_job(run) -> list[int]:
    """scancel a SLURM run's job; recorded as stopped, killed (as `kill` records a local run) unless
    it recorded its end first. No pids: they live on the job's nodes."""
    from ..slurm import cluster

    run = _as_run(run)
    job = run.slurm["job_id"]
    cluster.cancel(job)
    if run.final_status() is None:
        run.write_final(Status.STOPPED, f"cancelled by the user (scancel of SLURM job {job})", killed=True)
    return []


def stop_job(run, grace_s: float | None = None, on_cancel=None) -> dict | None:
    """A SLURM run's graceful stop: the stop file (node 0's supervisor polls it, on the shared
    filesystem, and tells every node), then scancel if it has not ended after the grace period; a job
    still waiting is cancelled at once (nothing of it runs). Returns its final status, None if the
    job is cancelled but has not ended yet. on_cancel(reason) is called before scancel."""
    run = _as_run(run)
    st = run.job_state()
    if st is not None and st.pending:
        if on_cancel is not None:
            on_cancel("it was still waiting in the queue")
        cancel_job(run)
        return run.final_status()
    request_stop(run)
    grace = SLURM_STOP_GRACE_S if grace_s is None else grace_s
    final = wait(run, timeout=grace)
    if final is None and run.final_status() is None:
        if on_cancel is not None:
            on_cancel(f"it had not ended {grace:g} s after the stop request")
        cancel_job(run)
        final = run.final_status()
    return final


def wait(run, timeout: float | None = None, interval: float = 0.2) -> dict | None:
    """The final status once the run ends (a vanished supervisor counts as failed); None on timeout."""
    run = _as_run(run)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        final = run.final_status()
        if final is not None:
            return final
        if run.status() == Status.LOST:
            time.sleep(0.3)  # it may have written status.json just before exiting
            return run.final_status() or {
                "status": "lost", "exit_codes": [],
                "root_cause": f"the supervisor exited without a final status; see {run.supervisor_log}"}
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(interval)
