"""SLURM's word for the runs submitted to it: pending and why while the job is queued (the status
`torchdeck runs` prints too), and under the table the job's state as SLURM says it (RUNNING on its
nodes, then its end). Asked in the Runs list's polling thread (never on a keypress), each job at
most every SLURM_EVERY_S, and a job that is over once."""
from __future__ import annotations

import time
from dataclasses import dataclass

from ...engine.rundir.layout import RunDir

SLURM_EVERY_S = 3.0
STYLE = {"pending": "bold magenta"}


@dataclass(frozen=True)
class JobWord:
    status: str  # the status cell while SLURM's word says more than the run's own; "" otherwise
    detail: str  # the detail line's: SLURM job N: STATE (reason) on NODES


def has_events(path) -> bool:
    try:
        return (RunDir(path).events_path.stat().st_size > 0)
    except OSError:
        return False


def word(job_id: str, state, reported: bool) -> JobWord:
    """What the list says of one job; `reported`: node 0's supervisor has written events."""
    if state is None:
        return JobWord("", f"SLURM job {job_id}: no longer known to SLURM")
    detail = f"SLURM job {job_id}: {state}"
    if state.pending:
        return JobWord(f"pending ({state.reason})" if state.reason else "pending", detail)
    if state.active and not reported:
        return JobWord("", detail + " · waiting for node 0's supervisor to report")
    return JobWord("", detail)


class JobStates:
    """Per run: its slurm.json (read until known), its job's last state and when it was asked."""

    def __init__(self):
        self._job: dict[str, str | None] = {}  # run key -> job id; None: not a SLURM run
        self._asked: dict[str, tuple[float, object]] = {}  # job id -> (monotonic time, JobState)

    def words(self, rows, now: float | None = None) -> dict[str, JobWord]:
        """run key -> SLURM's word, for the SLURM runs among `rows` (call it off the UI thread)."""
        now = time.monotonic() if now is None else now
        out = {}
        for r in rows:
            job_id = self._job_of(r)
            if job_id is None:
                continue
            hit = self._asked.get(job_id)
            over = hit is not None and (hit[1] is None or not hit[1].active)
            if hit is None or (not over and now - hit[0] >= SLURM_EVERY_S):
                hit = self._asked[job_id] = (now, RunDir(r.path).job_state())
            out[r.key] = word(job_id, hit[1], has_events(r.path))
        return out

    def _job_of(self, r) -> str | None:
        if r.key in self._job:
            return self._job[r.key]
        job = RunDir(r.path).slurm
        job_id = str(job["job_id"]) if job else None
        if job_id is not None or r.status.final or has_events(r.path):
            self._job[r.key] = job_id  # a SLURM run has slurm.json before its first event
        return job_id
