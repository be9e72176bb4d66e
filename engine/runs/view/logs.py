"""The log: what the events say in words (checkpoints, log lines, errors, stacks) and what the
processes printed (the follower's add_output)."""
from __future__ import annotations

import bisect
import time

from .parse import Malformed, as_text, rank_of
from .records import LOG_LINES, LogLine

ERRORS_KEPT = 100  # error events kept in `errors`: the first half (the first explains the rest) and the newest
TRACEBACK_LINES = 5000  # lines of a rank's tracebacks kept to leave its log's copy out; then only its newest


class Logs:
    """RunView's log reducers (a mixin: they read and write the view's fields)."""

    def _log(self, t, level, rank, text, detail="") -> LogLine:
        line = LogLine(t, level, rank, text, detail, self.log_seq + 1)
        if self.logs and t < self.logs[-1].t:
            bisect.insort_right(self.logs, line, key=lambda ln: ln.t)
            self.log_rewrites += 1
        else:
            self.logs.append(line)
        if len(self.logs) > LOG_LINES:
            del self.logs[:len(self.logs) - LOG_LINES]
        self.log_seq += 1
        return line

    def _on_checkpoint(self, ev, t) -> None:
        self._log(t, "info", ev.get("rank") if ev.get("rank") is None else rank_of(ev.get("rank")),
                  f"checkpoint saved: {as_text(ev.get('path'), '?')} (step {as_text(ev.get('step'), '?')})")

    def _on_log(self, ev, t) -> None:
        level = as_text(ev.get("level"), "info")
        msg = as_text(ev.get("message"))
        rank = None if ev.get("rank") is None else rank_of(ev.get("rank"))
        if rank is None and msg.startswith("stop requested"):
            self.stop_requested = True
        if msg.startswith("loss: ") and rank in (0, None) and level == "info":
            self.loss_rule = msg[6:].strip()  # the loss the run decided on (rank 0 says it once)
        self._log(t, level, rank, msg)

    def _on_error(self, ev, t) -> None:
        rank = None if ev.get("rank") is None else rank_of(ev.get("rank"))
        text = (f"rank {rank} on {as_text(ev.get('host')) or '?'} (pid {as_text(ev.get('pid')) or '?'}): "
                f"{as_text(ev.get('exception')) or 'Error'}: {as_text(ev.get('message'))}")
        detail = as_text(ev.get("traceback")).rstrip()
        seen = self._traceback_lines.setdefault(rank, set())
        if len(seen) > TRACEBACK_LINES:  # a live run that keeps failing: its memory stays flat
            seen.clear()
        seen.update(ln.rstrip() for ln in detail.splitlines())
        # itself, not looked up in the log: one older than the whole log is out of it at once
        self.errors.append(self._log(t, "error", rank, text, detail))
        if len(self.errors) > ERRORS_KEPT:
            del self.errors[ERRORS_KEPT // 2]
        if rank is not None:
            st = self.rank(rank)
            st.last_seen = t if st.last_seen is None else max(st.last_seen, t)

    def _on_stacks(self, ev, t) -> None:
        """Where the ranks were when the supervisor looked (a rank went silent, a collective timed out)."""
        groups = ev.get("groups")
        if not isinstance(groups, list):
            raise Malformed("stacks without groups")
        groups = [g for g in groups if isinstance(g, dict)]
        summary = as_text(ev.get("summary")) or " | ".join(f"{as_text(g.get('who'))}: {as_text(g.get('where'))}"
                                                          for g in groups)
        reason = as_text(ev.get("reason"), "asked")
        self.stacks = {"t": t, "reason": reason, "summary": summary, "groups": groups}
        self._log(t, "warning", None, f"stacks ({reason}): {summary}")

    def add_output(self, rank: int | None, text: str, t: float | None = None) -> None:
        """A line a worker (or the supervisor) printed to its log file. The traceback a failing
        rank prints there is already shown with its error event: not a second time."""
        if text.strip() and text.rstrip() in self._traceback_lines.get(rank, ()):
            return
        if rank is None and any(ln.text == text.strip() for ln in self.logs[-20:]):
            return  # the supervisor's log repeats what its events said ("run finished")
        self._log(t or self.last_t or time.time(), "output", rank, text)
        self.version += 1
