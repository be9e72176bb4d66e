"""A SLURM run before node 0's supervisor reports: the Monitor's header says SLURM's own word for the
job (PENDING and its reason, RUNNING while torchdeck starts on its nodes), asked in a thread at most
every SLURM_EVERY_S; once node 0's events arrive the run's own header takes over. Mixed into
MonitorScreen."""
from __future__ import annotations

from rich.text import Text
from textual import work
from textual.message import Message
from textual.worker import get_current_worker

SLURM_EVERY_S = 3.0
STYLE = {"PENDING": "bold magenta", "RUNNING": "bold cyan"}


def waiting(view) -> bool:
    """Node 0 has not reported yet (no run_started), and the run has not ended."""
    return view.started_t is None and not view.final


def header_text(job: dict, state, run_name: str) -> Text:
    """The header of a job SLURM holds: its state and job id, then why it waits (or what comes next)."""
    word = state.state if state is not None else "SUBMITTED"
    t = Text()
    t.append(f" {word} ", style=STYLE.get(word, "bold") + " reverse")
    t.append(f" {run_name}", style="bold")
    t.append(f" · SLURM job {job.get('job_id')}")
    if state is not None and state.num_nodes:
        t.append(f" · {state.num_nodes} node{'s' if state.num_nodes > 1 else ''}")
    t.append("\n ")
    if state is None:
        t.append("asking SLURM about the job ...", style="cyan")
    elif state.pending:
        t.append(f"waiting in the queue: {state.reason or 'no reason given'}", style="magenta")
        if state.reason == "JobHeldUser":
            t.append(f" (scontrol release {job.get('job_id')} lets it start)", style="dim")
    elif state.active:
        on = f" on {state.nodes}" if state.nodes else ""
        t.append(f"started{on}: waiting for node 0's supervisor to report", style="cyan")
    else:
        t.append(f"SLURM says {state}", style="yellow")
    return t


class SlurmWaiting:
    """Follow the job's SLURM state while the run has no events of its own."""

    _job = None  # slurm.json of a run submitted to SLURM, read once
    _job_state = None
    _job_known = False  # SLURM has answered at least once

    def watch_job(self) -> None:
        """On mount: a run submitted to SLURM is followed through SLURM until node 0 reports."""
        self._job = self.run_dir.slurm
        if self._job is not None and waiting(self.run_state):
            self._watch_job()

    class JobState(Message):
        def __init__(self, state):
            super().__init__()
            self.job_state = state

    @work(thread=True, exclusive=True, group="monitor-slurm")
    def _watch_job(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled and not self._quit_evt.is_set():
            state = self.run_dir.job_state()
            self.post_message(self.JobState(state))
            if state is None or not state.active or not waiting(self.run_state):
                return  # over, or node 0 reports now: the run's own header says the rest
            self._quit_evt.wait(SLURM_EVERY_S)

    def on_slurm_waiting_job_state(self, msg: "SlurmWaiting.JobState") -> None:
        self._job_state, self._job_known = msg.job_state, True
        self._paint()

    def queued_header(self) -> Text | None:
        """The header while SLURM holds the job and node 0 is silent; None otherwise."""
        if self._job is None or not self._job_known or not waiting(self.run_state):
            return None
        if self._job_state is not None and not self._job_state.active:
            return None  # over before torchdeck started: the run's own end (its root cause) says why
        return header_text(self._job, self._job_state, self.run_dir.name)
