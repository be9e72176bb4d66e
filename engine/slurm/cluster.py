"""SLURM's own commands (sbatch, squeue, scontrol, scancel, sinfo), called from the login node.

Each call has a timeout (a slurmctld that does not answer must not hang the CLI or the app) and
turns SLURM's refusal into a SlurmError carrying SLURM's own words: they say what is wrong better
than a paraphrase (`Batch job submission failed: Invalid partition name specified`).
A job's state comes from squeue while it is queued or running, then from `scontrol show job`
(SLURM keeps an ended job MinJobAge seconds), then from sacct where the cluster has accounting.
Stdlib only: the run directory's status asks from here (engine.rundir.layout).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import TorchdeckError

TIMEOUT_S = 20.0  # one SLURM command; a busy slurmctld answers in well under a second
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})


class SlurmError(TorchdeckError):
    """A SLURM command refused or could not run; its message is SLURM's own line(s)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, PREEMPTED, TIMEOUT, ...
    reason: str = ""  # why it waits (Priority, Resources, JobHeldUser) or why it ended; "" for None
    nodes: str = ""  # its node list (n[1-2]), once it has nodes
    exit_code: str = ""  # SLURM's exit:signal, e.g. 0:0, 1:0, 0:15
    num_nodes: int | None = None

    @property
    def active(self) -> bool:
        """Queued or running: not over yet."""
        return self.state in ACTIVE

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        code = f", exit {self.exit_code}" if self.exit_code and not self.active else ""
        on = f" on {self.nodes}" if self.nodes and self.state in ("RUNNING", "COMPLETING") else ""
        return f"{self.state}{why}{on}{code}"


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int  # how many nodes it has
    state: str  # up, down, drain, inact
    max_time: str  # its time limit as SLURM writes it (infinite, 1-00:00:00)
    default: bool  # the one a job without --partition goes to
    cpus: int | None = None  # CPUs per node (the smallest node's, where they differ)


def available() -> str | None:
    """None when sbatch is on PATH, else what to do about it."""
    if shutil.which("sbatch"):
        return None
    return ("sbatch is not on PATH: run this on the cluster's login node (or load its SLURM module, "
            "e.g. `module load slurm`)")


def _run(argv: list[str], timeout: float = TIMEOUT_S, check: bool = True, cwd=None) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                             stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(available() or f"{argv[0]} is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer in {timeout:g} s (is slurmctld up? `sinfo` says)") from None
    if check and out.returncode != 0:
        raise SlurmError(_said(out) or f"{' '.join(argv[:2])} failed with exit status {out.returncode}")
    return out


def _said(out: subprocess.CompletedProcess) -> str:
    """SLURM's message: its stderr lines (`sbatch: error: ...`), joined."""
    lines = [ln.strip() for ln in (out.stderr or out.stdout or "").splitlines() if ln.strip()]
    return "; ".join(lines)


def sbatch(script_path: str | os.PathLike, cwd: str | os.PathLike | None = None, extra: list[str] | None = None) -> str:
    """Submit the script; the job id SLURM gave it. SlurmError with sbatch's words when refused."""
    out = _run(["sbatch", "--parsable", *(extra or []), str(script_path)], cwd=cwd)
    job = out.stdout.strip().splitlines()[-1].split(";")[0].strip() if out.stdout.strip() else ""
    if not job:
        raise SlurmError(f"sbatch gave no job id ({_said(out) or 'no output'})")
    return job


_FIELDS = ("%i", "%T", "%r", "%N", "%D")


def _from_squeue(job_id: str) -> JobState | None:
    out = _run(["squeue", "-h", "-j", str(job_id), "-o", "|".join(_FIELDS)], check=False)
    if out.returncode != 0:
        return _unknown(out)
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == len(_FIELDS) and parts[0].strip() == str(job_id):
            _, state, reason, nodes, count = (p.strip() for p in parts)
            return JobState(str(job_id), state, "" if reason == "None" else reason, nodes,
                            num_nodes=int(count) if count.isdigit() else None)
    return None


def _unknown(out: subprocess.CompletedProcess) -> None:
    """None for a job SLURM does not know (`Invalid job id specified`); SlurmError when SLURM did not
    answer (`Unable to contact slurm controller`): a job must not be taken for over because of that."""
    if "invalid job id" in (out.stderr or "").lower():
        return None
    raise SlurmError(_said(out) or "squeue/scontrol failed with no message")


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=")


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job ID -o`'s one line as key -> value (a value may hold spaces: WorkDir, Command)."""
    text = text.strip()
    keys = list(_KEY.finditer(text))
    out = {}
    for m, nxt in zip(keys, keys[1:] + [None]):
        out[m.group(1)] = text[m.end():nxt.start() if nxt else len(text)].strip()
    return out


def _from_scontrol(job_id: str) -> JobState | None:
    out = _run(["scontrol", "show", "job", str(job_id), "-o"], check=False)
    if out.returncode != 0:
        return _unknown(out)
    f = parse_show_job(out.stdout.splitlines()[0] if out.stdout.strip() else "")
    if "JobState" not in f:
        return None
    reason = f.get("Reason", "")
    count = f.get("NumNodes", "")
    return JobState(str(job_id), f["JobState"], "" if reason in ("None", "(null)") else reason,
                    "" if f.get("NodeList") in (None, "(null)") else f["NodeList"], f.get("ExitCode", ""),
                    num_nodes=int(count) if count.isdigit() else None)


def _from_sacct(job_id: str) -> JobState | None:
    if not shutil.which("sacct"):
        return None
    out = _run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State,Reason,NodeList,ExitCode"], check=False)
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = line.split("|")
        if len(parts) == 5 and parts[0] == str(job_id):
            state = parts[1].split()[0] if parts[1].strip() else ""  # "CANCELLED by 0"
            return JobState(str(job_id), state, "" if parts[2] == "None" else parts[2], parts[3], parts[4])
    return None


def job_state(job_id: str) -> JobState | None:
    """Where the job is now; None when SLURM no longer knows it; SlurmError when it does not answer."""
    return _from_squeue(job_id) or _from_scontrol(job_id) or _from_sacct(job_id)


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel the job; with a signal (USR1, TERM), signal its batch step instead of ending it."""
    argv = ["scancel"] + ([f"--signal={signal}", "--batch"] if signal else []) + [str(job_id)]
    _run(argv)


def hold(job_id: str) -> None:
    _run(["scontrol", "hold", str(job_id)])


def release(job_id: str) -> None:
    _run(["scontrol", "release", str(job_id)])


def partitions() -> list[Partition]:
    """Every partition sinfo lists, the default one marked (sinfo writes it with a '*')."""
    out = _run(["sinfo", "-h", "-o", "%P|%D|%a|%l|%c"])
    parts: dict[str, Partition] = {}
    for line in out.stdout.splitlines():
        f = line.split("|")
        if len(f) != 5:
            continue
        name, default = f[0].strip().rstrip("*"), f[0].strip().endswith("*")
        count = int(f[1]) if f[1].strip().isdigit() else 0
        cpus = int(f[4].rstrip("+")) if f[4].rstrip("+").strip().isdigit() else None
        old = parts.get(name)  # one line per kind of node: add them up
        if old is not None and old.cpus is not None:
            cpus = old.cpus if cpus is None else min(cpus, old.cpus)
        parts[name] = Partition(name, count + (old.nodes if old else 0), f[2].strip(), f[3].strip(),
                                default or bool(old and old.default), cpus)
    return list(parts.values())
