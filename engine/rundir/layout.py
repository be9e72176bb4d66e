"""The run directory: everything one run leaves behind. `RunDir` owns every path in it and is the
one writer of a run's final status.

    runs/<YYYYmmdd-HHMMSS>-<name>/
        config.yaml        the resolved config the run was started with
        origin.json        where it came from: the preset and the --set overrides
        events.jsonl       one event per line (engine.events)
        metrics.csv        step and epoch figures as flat columns (engine.metrics), written as they come
        tensorboard/       TensorBoard event files, with logging.tensorboard: true
        supervisor.pid     pid of the supervisor while it lives (its process group = its pid)
        launcher.pid       torchrun's agent, for a run written under torchrun (no supervisor)
        supervisor.log     the supervisor's own output
        rank<N>.log        stdout/stderr of global rank N
        rank<N>.stacks     the rank's Python stacks, written when asked (engine/rundir/stacks.py)
        supervisor.stacks  the same for the supervisor
        nccl_trace_rank_<N>  NCCL's flight recorder of rank N, dumped when a collective times out (GPU)
        status.json        final status, written last: {"status", "exit_codes", "root_cause", "elapsed_s"}
        stop               present: a graceful stop was asked (the supervisor also takes SIGTERM)
        preempted          present with stop: the stop is SLURM's preemption warning (status preempted)
        checkpoints/       ckpt-<step>.pt, newest complete one is the resume point
        slurm.json         a run submitted to SLURM: {"job_id", "submitted", "script", "output"}
        job.sbatch         its batch script; slurm-<job id>.out: the job's own output (engine/slurm/)
        node<K>/           node K's own files, for a multi-node SLURM job (node 0 writes here)

No torch, no textual: the app lists and opens runs on its first frame.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import events
from ..files import write_atomic  # noqa: F401  (readers never see half a file; importers take it from here)
from ..procs import pid_alive
from .status import Status, decide

_STAMP = re.compile(r"^(\d{8}-\d{6})-(.+)$")
SLURM_FILE = "slurm.json"
SETTLE_S = 5.0  # a SLURM job over for this long (nothing written since) with no final status never will write one
_JOB_CACHE_S = 0.5  # one squeue answers every question about a job asked this close together
_jobs: dict[str, tuple[float, object]] = {}

# ----------------------------------------------------------------------------- checkpoint names
# The one rule for what a checkpoint is called. engine.checkpoint writes them (it imports torch,
# this module must not); everything that looks for one reads the names here.
CHECKPOINT_META = "torchdeck.pt"  # in a checkpoint folder: epoch, step, RNG, config; written last, so it marks it complete
_CKPT = re.compile(r"ckpt-(\d{8,})(\.pt)?")  # a file, or a folder (deepspeed: every rank writes a part)


def checkpoint_name(step: int, folder: bool = False) -> str:
    """ckpt-<step>.pt, or ckpt-<step> for a checkpoint folder."""
    return f"ckpt-{step:08d}" + ("" if folder else ".pt")


def checkpoint_step(name: str) -> tuple[int, bool] | None:
    """(step, is a folder) from a checkpoint's name (a path's last part is used); None for
    anything else."""
    m = _CKPT.fullmatch(Path(name).name)
    return (int(m.group(1)), not m.group(2)) if m else None


def checkpoints_in(folder: str | Path, dirs: bool | None = None) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints in a folder, oldest first: files, folders holding
    their CHECKPOINT_META (dirs=True), or both (None)."""
    out = []
    try:
        for p in Path(folder).iterdir():
            found = checkpoint_step(p.name)
            if found is None or (dirs is not None and found[1] != dirs):
                continue
            if (p / CHECKPOINT_META).is_file() if found[1] else p.is_file():
                out.append((found[0], p))
    except OSError:
        return []
    return sorted(out)


def runs_root() -> Path:
    """Where runs go: $TORCHDECK_RUNS, else ./runs under the current directory."""
    return Path(os.environ.get("TORCHDECK_RUNS", "runs")).resolve()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"


def new_group_dir(kind: str, name: str, root: Path | None = None) -> Path:
    """runs/<kind>-<YYYYmmdd-HHMMSS>-<name>/, unique: a directory grouping several runs (a
    comparison of strategies, a batch-size search)."""
    root = Path(root) if root else runs_root()
    root.mkdir(parents=True, exist_ok=True)
    base = root / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}"
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def create(cls, cfg, root: Path | None = None, origin: dict | None = None) -> "RunDir":
        """A new, uniquely named directory holding the resolved config (and where it came from)."""
        from .. import config as cfgmod

        root = Path(root) if root else runs_root()
        root.mkdir(parents=True, exist_ok=True)
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(cfg.name)}"
        path, n = root / base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = root / f"{base}-{n}"
        rd = cls(path)
        cfgmod.save(cfg, rd.config_path)
        if origin:
            write_atomic(rd.origin_path, json.dumps(origin, indent=2))
        return rd

    # ---------------------------------------------------------------- names and paths
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def short_name(self) -> str:
        """The run's name without the time stamp its directory starts with."""
        m = _STAMP.match(self.name)
        return m.group(2) if m else self.name

    @property
    def stamp_time(self) -> float | None:
        m = _STAMP.match(self.name)
        if not m:
            return None
        try:
            return time.mktime(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))
        except ValueError:
            return None

    config_path = property(lambda self: self.path / "config.yaml")
    origin_path = property(lambda self: self.path / "origin.json")
    events_path = property(lambda self: self.path / "events.jsonl")
    metrics_path = property(lambda self: self.path / "metrics.csv")
    tensorboard_dir = property(lambda self: self.path / "tensorboard")
    status_path = property(lambda self: self.path / "status.json")
    pid_path = property(lambda self: self.path / "supervisor.pid")
    launcher_pid_path = property(lambda self: self.path / "launcher.pid")
    supervisor_log = property(lambda self: self.path / "supervisor.log")
    stop_path = property(lambda self: self.path / "stop")
    preempt_path = property(lambda self: self.path / "preempted")
    checkpoint_dir = property(lambda self: self.path / "checkpoints")
    reserve_path = property(lambda self: self.path / ".reserve")
    slurm_path = property(lambda self: self.path / SLURM_FILE)

    def checkpoints_at(self, cfg=None) -> Path:
        """Where its checkpoints go: checkpoint.dir when the config sets one, else checkpoints/ here."""
        if cfg is not None and getattr(cfg.checkpoint, "dir", ""):
            return Path(cfg.checkpoint.dir).expanduser()
        return self.checkpoint_dir

    def checkpoints(self, cfg=None) -> list[tuple[int, Path]]:
        """(step, path) of its complete checkpoints, files or folders, oldest first."""
        return checkpoints_in(self.checkpoints_at(cfg))

    def newest_checkpoint(self) -> tuple[int, Path] | None:
        """(step, path) of the checkpoint a resume or `torchdeck eval RUN` would use; None if none."""
        try:
            cfg = self.config()
        except Exception:  # an unreadable config: look in checkpoints/ here
            cfg = None
        found = self.checkpoints(cfg)
        return found[-1] if found else None

    flight_recorder_prefix = property(lambda self: self.path / "nccl_trace_rank_")

    def flight_records(self) -> list[Path]:
        """The NCCL flight recorder dumps the ranks of this node left (one per rank, on a timeout)."""
        try:
            return sorted(self.path.glob(self.flight_recorder_prefix.name + "*"))
        except OSError:
            return []

    def rank_log(self, rank: int) -> Path:
        return self.path / f"rank{rank}.log"

    def stacks_path(self, rank: int | None) -> Path:
        """Where a rank (None: the supervisor) dumps its stacks when asked (engine/rundir/stacks.py)."""
        return self.path / ("supervisor.stacks" if rank is None else f"rank{rank}.stacks")

    # ---------------------------------------------------------------- reading
    def config(self):
        from .. import config as cfgmod

        return cfgmod.load(self.config_path)

    def origin(self) -> dict:
        """{"preset": name or path, "overrides": ["key=value", ...]}; {} for runs without one."""
        try:
            data = json.loads(self.origin_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def final_status(self) -> dict | None:
        try:
            data = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def supervisor_pid(self) -> int | None:
        """Its pid file while it lives; afterwards the pid the final status recorded (the session
        id that finds any process of the run left behind)."""
        return _read_pid(self.pid_path) or self._recorded("supervisor_pid")

    def launcher_pid(self) -> int | None:
        return _read_pid(self.launcher_pid_path) or self._recorded("launcher_pid")

    def _recorded(self, key: str) -> int | None:
        final = self.final_status()
        pid = final.get(key) if final else None
        return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None

    def owner_pid(self) -> int | None:
        """The process the run lives in while it runs: its supervisor, or torchrun's agent."""
        return _read_pid(self.pid_path) or _read_pid(self.launcher_pid_path)

    def is_live(self) -> bool:
        """True while the supervisor (or torchrun's agent, or the SLURM job) exists and no final status is written."""
        return self.final_status() is None and self.owner_alive()

    @property
    def slurm(self) -> dict | None:
        """slurm.json of a run submitted to SLURM ({"job_id", "submitted", "script", "output"}); None otherwise."""
        try:
            data = json.loads(self.slurm_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("job_id") else None

    def job_state(self):
        """SLURM's word on the run's job now (engine.slurm.cluster.JobState); None for a run not
        submitted to SLURM, a job SLURM forgot, or a SLURM that does not answer."""
        job = self.slurm
        if job is None:
            return None
        from ..slurm import cluster

        try:
            return self._ask_job(job)
        except cluster.SlurmError:
            return None

    def _ask_job(self, job: dict):
        """The job's state (None: SLURM forgot it); SlurmError when SLURM does not answer."""
        from ..slurm import cluster

        key, now = str(job["job_id"]), time.monotonic()
        hit = _jobs.get(key)
        if hit is None or now - hit[0] > _JOB_CACHE_S:
            hit = _jobs[key] = (now, cluster.job_state(key))
        return hit[1]

    def owner_alive(self) -> bool:
        """Whether what runs the run still exists: for a SLURM run its job (its supervisor lives on
        another host, where a pid here says nothing), else its supervisor's or torchrun agent's pid."""
        job = self.slurm
        if job is None:
            return pid_alive(self.owner_pid())
        from ..slurm.cluster import SlurmError

        try:
            st = self._ask_job(job)
        except SlurmError:  # SLURM did not answer (slurmctld restarting, no sbatch here): nothing is known
            return True
        if st is not None and st.active:
            return True
        if self.final_status() is None:
            self._job_ended(job, st)
        return False

    def _job_ended(self, job: dict, st) -> None:
        """The job is over and nothing of torchdeck recorded an end (its supervisor never started,
        or went with the job): recorded here from SLURM's state and the job's output, once the run
        has been quiet SETTLE_S (a stopping supervisor may still be writing its own)."""
        out = Path(str(job.get("output") or ""))
        quiet = self.quiet_s()
        try:
            quiet = min(quiet if quiet is not None else 1e9, time.time() - out.stat().st_mtime)
        except OSError:
            pass
        if st is None or (quiet is not None and quiet < SETTLE_S) or self.final_status() is not None:
            return  # a job SLURM forgot: nothing to say but what the run directory says (lost, by decide)
        jid = job["job_id"]
        if st.state == "CANCELLED":
            self.write_final(Status.STOPPED, f"SLURM job {jid} was cancelled (scancel) before the run recorded "
                                             f"an end{_tail(out)}", killed=True)
        else:
            self.write_final(Status.FAILED, f"SLURM job {jid} ended {st} before torchdeck's supervisor recorded "
                                            f"an end{_tail(out)}")

    def quiet_s(self, now: float | None = None) -> float | None:
        """Seconds since the run last showed a sign of life on disk (events, or its creation)."""
        now = time.time() if now is None else now
        newest = None
        for p in (self.events_path, self.config_path):
            try:
                m = p.stat().st_mtime
            except OSError:
                continue
            newest = m if newest is None else max(newest, m)
        return None if newest is None else max(0.0, now - newest)

    def status(self, stepped: bool = True, now: float | None = None) -> Status:
        """The status from the directory alone (see engine.rundir.status.decide). Without events read,
        a live run counts as running unless the caller knows no step came yet."""
        alive = self.final_status() is None and self.owner_alive()
        final = self.final_status()
        pid = self.owner_pid()
        return decide(final.get("status") if final else None, alive, pid is not None,
                      stepped, self.quiet_s(now))

    # ---------------------------------------------------------------- writing
    def write_pid(self, pid: int) -> None:
        write_atomic(self.pid_path, f"{pid}\n")

    def write_final(self, status: str, root_cause: str | None = None, exit_codes=None,
                    elapsed_s: float | None = None, emit=None, **extra) -> dict:
        """How the run ended, written once and last: the run_finished event (through `emit`, the
        caller's event writer, or appended here), then status.json, then the pid files go (they
        exist while the run lives). Returns the status dict."""
        final = {"status": str(status), "exit_codes": list(exit_codes or []), "root_cause": root_cause,
                 "elapsed_s": elapsed_s, **extra}
        for key, path in (("supervisor_pid", self.pid_path), ("launcher_pid", self.launcher_pid_path)):
            pid = _read_pid(path)
            if pid:
                final[key] = pid  # the pid files go below; kill and "nothing left" checks still need it
        ev = events.make("run_finished", **{k: final[k] for k in ("status", "exit_codes", "root_cause", "elapsed_s",
                                                                  "failed_local_rank", "killed") if k in final})
        try:
            if emit is not None:
                emit(ev)
            else:
                with open(self.events_path, "a") as fh:
                    fh.write(events.dumps(ev) + "\n")
        except OSError:
            pass  # the status file still says how it ended
        write_atomic(self.status_path, json.dumps(final, indent=2))
        for p in (self.pid_path, self.launcher_pid_path):
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
        return final


def _tail(path: Path, n: int = 5) -> str:
    """'; the last lines of <file>: a / b / c', for a root cause; '' when it has none."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - 4096))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f"; the last lines of {path}: " + " / ".join(lines[-n:]) if lines else f"; {path} is empty"


COMPARISON_FILE = "compare.json"  # marks a directory grouping the runs of `torchdeck compare`


def comparison_of(run: "RunDir") -> Path | None:
    """The comparison directory a run belongs to, if it was run by `torchdeck compare`."""
    parent = run.path.parent
    return parent if (parent / COMPARISON_FILE).is_file() else None


def list_runs(root: Path | None = None) -> list[RunDir]:
    """Every run directory under root, and those grouped in a comparison directory there, newest
    first (by modification time)."""
    root = Path(root) if root else runs_root()
    dirs = []
    try:
        for p in root.iterdir():
            if RunDir(p).config_path.is_file():
                dirs.append(RunDir(p))
            elif (p / COMPARISON_FILE).is_file():
                dirs += [RunDir(q) for q in p.iterdir() if RunDir(q).config_path.is_file()]
    except OSError:
        return dirs

    def mtime(r: RunDir) -> float:
        try:
            return r.path.stat().st_mtime
        except OSError:
            return 0.0
    dirs.sort(key=mtime, reverse=True)
    return dirs
