"""A run's status: one type and one set of rules, for the CLI, the Monitor and the Runs list.

    starting   launched, no training step yet (supervisor starting, ranks importing torch, ...)
    running    its supervisor (or torchrun's agent) lives and the ranks are training
    finished   ended well                       } written by the run itself:
    failed     a rank or the supervisor failed  } run_finished event and status.json
    stopped    ended early on request, after a checkpoint; or killed by the user (status.json
               killed: true; its root cause says so, and `torchdeck run`/`launch` exit 130)
    preempted  SLURM's warning signal (USR1) came: checkpointed and stopped; the job is requeued
               and resumes from that checkpoint in a new run directory
    lost       no final status, and nothing of it lives (supervisor killed, host rebooted)
"""
from __future__ import annotations

from enum import Enum

YOUNG_S = 60.0  # a run directory without a supervisor pid may still be starting this long


class Status(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    PREEMPTED = "preempted"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__  # "finished" in FINAL works for plain strings too

    @property
    def final(self) -> bool:
        """Over: nothing of it trains any more."""
        return self in FINAL

    @property
    def live(self) -> bool:
        return self in LIVE

    @property
    def ended_well(self) -> bool:
        """Over without anything going wrong: finished, or stopped on request or by preemption after a
        checkpoint (exit status 0 of torchdeck run/attach/stop/compare and of the supervisor)."""
        return self in ENDED_WELL

    @property
    def went_wrong(self) -> bool:
        """Over because something failed: a rank or the supervisor (failed), or it vanished (lost)."""
        return self.final and not self.ended_well

    @property
    def ended_early(self) -> bool:
        """Over before its end: its root cause, when one was recorded, is worth saying."""
        return self.final and self is not Status.FINISHED

    @classmethod
    def of_final(cls, value) -> "Status":
        """A recorded final status (status.json, run_finished); anything unknown counts as failed."""
        try:
            st = cls(str(value))
        except ValueError:
            return cls.FAILED
        return st if st in RECORDED else cls.FAILED

    @classmethod
    def of(cls, value) -> "Status | None":
        """The Status a string names; None for anything else (a comparison's 'skipped', 'waiting')."""
        try:
            return cls(str(value))
        except ValueError:
            return None


LIVE = frozenset({Status.STARTING, Status.RUNNING})
ENDED_WELL = frozenset({Status.FINISHED, Status.STOPPED, Status.PREEMPTED})
RECORDED = ENDED_WELL | {Status.FAILED}  # what a run writes itself (status.json, run_finished)
FINAL = RECORDED | {Status.LOST}


def decide(final: str | None, alive: bool, has_pid: bool, stepped: bool, quiet_s: float | None) -> Status:
    """The rule, from facts anyone can read off the run directory:

    final    the recorded final status, if any (it wins)
    alive    the supervisor's (or torchrun agent's) process exists
    has_pid  a pid file exists at all
    stepped  a training step (or a rank report) was seen
    quiet_s  seconds since the run last showed a sign of life (newest event, or its creation)
    """
    if final is not None:
        return Status.of_final(final)
    if alive:
        return Status.RUNNING if stepped else Status.STARTING
    if not has_pid and quiet_s is not None and quiet_s < YOUNG_S:
        return Status.RUNNING if stepped else Status.STARTING  # no pid written yet: believable a while
    return Status.LOST
