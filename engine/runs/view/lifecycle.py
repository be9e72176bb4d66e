"""The run's life: run_started, run_finished, and what the run directory says about its processes
(status.json, pid files) for a run whose events did not say how it ended."""
from __future__ import annotations

from ... import fmt
from ...kinds import kind_of
from ...rundir.status import FINAL, Status, decide
from .parse import as_text, real, whole
from .records import KILLED, KILLED_EXIT


class Lifecycle:
    """RunView's start and end reducers (a mixin: they read and write the view's fields)."""

    def _on_run_started(self, ev, t) -> None:
        self.run = as_text(ev.get("run")) or self.run
        self.strategy = as_text(ev.get("strategy")) or self.strategy
        self.world_size = whole(ev.get("world_size"))
        self.num_nodes = whole(ev.get("num_nodes"), 1)
        self.node_rank = whole(ev.get("node_rank"), 0)  # the node whose run directory this is
        gb = ev.get("global_batch")
        self.global_batch = gb if isinstance(gb, int) and not isinstance(gb, bool) else None
        devs = ev.get("devices")
        self.devices = [str(d) for d in devs] if isinstance(devs, list) else []
        self.host = as_text(ev.get("host"))
        self.run_kind = as_text(ev.get("run_kind"))
        cmd = ev.get("command")
        self.command = [str(c) for c in cmd] if isinstance(cmd, list) else []
        pid = ev.get("pid")
        self.supervisor_pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        self.total_steps = whole(ev.get("total_steps"))
        # the epoch the run ends in: train.epochs, or the earlier one train.max_steps ends it in
        # (end_epoch, engine.preflight.Length; older run directories carry only epochs)
        self.total_epochs = whole(ev.get("end_epoch"), 0) or whole(ev.get("epochs"), 0) or None
        self.started_t = t
        loss = ev.get("loss")
        self.loss_rule = loss if isinstance(loss, str) and loss else self.loss_rule
        for st in self.ranks.values():
            st.total_steps = st.total_steps or self.total_steps
        port = ev.get("master_port")
        kind = kind_of(self)
        batch = f", global batch {self.global_batch or '?'}" if kind.loop_config else ""  # else the script's own
        what = " ".join(self.command) if kind.ranks_from_shim and self.command else self.strategy
        self._log(t, "info", None, f"run started: {what}, world size {self.world_size}{batch}, devices "
                                   f"{fmt.device_list(self.devices) or '?'}" + (f", master port {port}" if port else ""))

    def _on_run_finished(self, ev, t) -> None:
        self.status = Status.of_final(ev.get("status"))
        self.root_cause = None if ev.get("root_cause") is None else as_text(ev.get("root_cause"))
        self.finished_t = t
        self._finished_event = True
        self._codes(ev)
        self._settle()
        elapsed = real(ev.get("elapsed_s"))
        if elapsed is not None and elapsed >= 0:
            self.elapsed_s = elapsed  # the run's own figure: every front end shows this one
        if self.started_t is None and elapsed is not None:
            self.started_t = t - elapsed
        text = f"run {self.status}" + (f": {self.root_cause}" if self.root_cause else "")
        self._log(t, "error" if self.status == Status.FAILED else "info", None, text)

    def _on_restart(self, ev, t) -> None:
        """The supervisor started the ranks again after a failure (train.max_restarts): one more
        part of the same run. The ranks start over (from the checkpoint's step, or a script's 0)."""
        attempt, most = whole(ev.get("attempt")), whole(ev.get("max_restarts"))
        cause = as_text(ev.get("cause"), "?")
        lost = real(ev.get("lost_s"))
        step = ev.get("resume_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        self.restarts = (*self.restarts, (attempt, most, cause, lost, step, t))
        self.start_step = step or 0
        for st in self.ranks.values():
            st.exited, st.step, st.phase, st._paused = None, self.start_step, "", True
        self.exit_codes, self.failed_local_rank = None, None
        where = (f"from the checkpoint of step {step}" if step else "from the start") + (
            f", {fmt.duration(lost)} of work lost" if lost is not None else "")
        self._log(t, "warning", None, f"restart {attempt}/{most} after a failure: {cause}; {where}")

    def restart_text(self) -> str | None:
        """'restart 2/3' once the run restarted (the header's count), None before."""
        if not self.restarts:
            return None
        attempt, most = self.restarts[-1][:2]
        return f"restart {attempt}/{most}"

    def observe(self, final: dict | None, alive: bool, has_pid: bool, quiet_s: float | None, now: float) -> None:
        """What the run directory says about the run's processes (status.json, pid files), for a
        run whose events have not said how it ended. A run_finished event has the last word: the
        follower reads the events again after it sees status.json (written after the event)."""
        if self._finished_event or self.status in FINAL:
            return
        stepped = self.first_step_t is not None
        st = decide(final.get("status") if final else None, alive, has_pid, stepped, quiet_s)
        if st == Status.LOST:
            self.status = Status.LOST
            self.root_cause = self.root_cause or (
                "the supervisor exited without a final status (killed, or its host went down); see supervisor.log"
                if has_pid else "no supervisor pid and no final status: it never started, or ran outside "
                                "torchdeck's supervisor")
            self.finished_t = self.finished_t or self.last_t or now
            self._log(self.finished_t, "error", None, f"run lost: {self.root_cause}")
            self._settle()
            self.version += 1
        elif st.final and final is not None:
            self.status = st
            elapsed = real(final.get("elapsed_s"))
            self.elapsed_s = elapsed if elapsed is not None and elapsed >= 0 else self.elapsed_s
            rc = final.get("root_cause")
            self.root_cause = self.root_cause or (None if rc is None else str(rc))
            self._codes(final)
            self.finished_t = self.finished_t or self.last_t or now
            self._settle()
            self.version += 1

    def _codes(self, final: dict) -> None:
        codes = final.get("exit_codes")
        if isinstance(codes, list):
            self.exit_codes = [c if isinstance(c, int) and not isinstance(c, bool) else None for c in codes]
        first = final.get("failed_local_rank")
        if isinstance(first, int) and not isinstance(first, bool):
            self.failed_local_rank = first
        if final.get("killed") is True:
            self.killed = True
            for st in self.ranks.values():  # SIGKILLed with their supervisor: no exit of theirs is recorded,
                if st.exited is None:  # and a rank still "running" kept its seen age counting up
                    st.exited = KILLED

    def _settle(self) -> None:
        """Over: every front end's rank lines show each rank's mean over the run (RankState.settle)."""
        for st in self.ranks.values():
            st.settle()

    def exit_code(self) -> int | None:
        """A script run's exit code as torchdeck launch exits with it (cli.main.script_exit_code's
        rule): 0 when it ended well, else the first failing rank's code (failed_local_rank's, else
        the first non-zero), a signal's death as a shell says it (128 + N), 1 when no code says
        more; KILLED_EXIT (130) when the user killed it; None while it runs."""
        if not self.final:
            return None
        if self.killed:
            return KILLED_EXIT
        if self.status.ended_well:
            return 0
        codes = [c for c in self.exit_codes or [] if c is not None]
        first = self.failed_local_rank
        if first is not None and 0 <= first < len(self.exit_codes or []) and self.exit_codes[first] is not None:
            codes.insert(0, self.exit_codes[first])
        for code in codes:
            if code > 0:
                return code if code < 256 else 1
            if code < 0:
                return 128 + (-code)
        return 1

    def elapsed(self, now: float) -> float | None:
        """Seconds the run has been going; once over, the duration it recorded itself (the one
        `torchdeck runs` and the Runs list show from status.json)."""
        if self.final and self.elapsed_s is not None:
            return self.elapsed_s
        if self.started_t is None:
            return None
        return max(0.0, (self.finished_t or now) - self.started_t)
