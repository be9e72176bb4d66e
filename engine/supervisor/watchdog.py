"""The watchdog: every rank's stacks when one turns stale or slow (the rules the Monitor marks
them by), and before the others are stopped when a collective timed out."""
from __future__ import annotations

import threading
import time

from .. import events
from ..rundir import stacks
from .outcome import is_timeout

SLOW_DUMP_EVERY_S = 60.0  # at most one stacks dump a minute for slow steps (a stale rank: always)


class Watchdog:
    """`emit(ev)` writes a supervisor event (and streams it to node 0); `script`: the ranks are a
    user's script's (they answer a stacks request only once they said rank_ready)."""

    def __init__(self, rd, emit, script: bool = False):
        self.rd, self.emit, self.script = rd, emit, script
        self.base = 0  # global rank of this node's local rank 0
        self.where: dict = {}  # rank -> where its stacks last showed it (the newest dump)
        self._lock = threading.Lock()
        self._stall_dumped = False  # one dump per stall: re-armed once no rank is stale
        self._slow_dumped_t = float("-inf")

    def dump_stacks(self, pctx, writer, reason: str, wait_s: float = stacks.WAIT_S) -> list[dict]:
        """Stacks of this node's live ranks, as a `stacks` event (and a line in supervisor.log)."""
        with self._lock:
            ready = None
            if self.script:  # a script's rank says rank_ready once its dump is installed: before that
                with writer.lock:  # (python starting, the shim's imports) STACK_SIGNAL would kill it
                    ready = {st.rank for st in writer.view.rank_list() if st.pid is not None}
            targets = [(f"rank {self.base + i}", self.base + i, p.pid, self.rd.stacks_path(self.base + i))
                       for i, p in enumerate(pctx.processes)
                       if p.is_alive() and (ready is None or self.base + i in ready)]
            if not targets:
                return []
            taken = stacks.collect(targets, wait_s)
            groups = stacks.group(taken)
            self.where.update({ps.rank: ps.where for ps in taken if not ps.error})
            line = stacks.summary(groups)
            self.emit(events.make("stacks", rank=None, reason=reason, summary=line, groups=groups,
                                  files=[ps.file for ps in taken]))
            try:
                print(f"stacks ({reason}): {line}", flush=True)
            except OSError:
                pass
            return groups

    def check(self, pctx, writer, stopping: bool) -> None:
        """When a rank turns stale (the rule the Monitor marks STALE by), or its step window in
        progress takes SLOW_MULTIPLE times its median (engine/runs/view.py), dump every rank's
        stacks once, in a thread (the join loop goes on); again only after every rank is back.
        Not while the run is stopping: its ranks are expected to go quiet."""
        now = time.time()
        silent = writer.stale(now)
        slow = [] if silent else writer.slow(now)
        if not silent and not slow:
            self._stall_dumped = False
            return
        if self._stall_dumped or stopping:
            return
        if not silent and now - self._slow_dumped_t < SLOW_DUMP_EVERY_S:
            return  # a straggling step that recurs (a slow file system): once a minute, not each time
        self._stall_dumped = True
        ranks = sorted(r for r, *_ in silent or slow)
        who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
        if silent:
            reason = f"{who} silent for {max(s for _, s in silent):.0f} s"
        else:
            self._slow_dumped_t = now
            took, med = max((t, m) for _, t, m in slow)
            reason = f"{who} slow: {took:.1f} s in a step window, {took / med:.0f}x the median window ({med:.2f} s)"
        threading.Thread(target=self.dump_stacks, args=(pctx, writer, reason), name="watchdog",
                         daemon=True).start()

    def on_failure(self, pctx, writer) -> None:
        """A rank gave up waiting in a collective: before the others are stopped, see where the
        ones that never arrived are (they are still alive, stuck)."""
        deadline = time.monotonic() + 1.0
        while not writer.errors and time.monotonic() < deadline:
            time.sleep(0.05)  # the failed rank's error event may still be in the pipe
        if any(is_timeout(e) for e in writer.errors) and any(p.is_alive() for p in pctx.processes):
            self.dump_stacks(pctx, writer, "a collective timed out", wait_s=2.0)
