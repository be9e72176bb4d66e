"""Where ranks run and how they start and end: rank_ready, phase, rank_exited, node_sample, and
what the headers say while a run starts."""
from __future__ import annotations

from ...events import epoch_number
from ...kinds import kind_of
from ...rundir.status import Status
from .parse import Malformed, as_text, real, whole
from .records import EXITING, NODE_LOST, PHASES, RankState


class Ranks:
    """RunView's rank and node reducers (a mixin: they read and write the view's fields)."""

    def _on_rank_ready(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        st.device = as_text(ev.get("device"))
        st.cpus = as_text(ev.get("cpus"))
        st.host = as_text(ev.get("host")) or st.host
        self._node(st, ev)
        pid = ev.get("pid")
        st.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        st.from_report = False
        st.last_seen = t

    @staticmethod
    def _node(st: RankState, ev: dict) -> None:
        """The node a rank's event came from (node 0's supervisor tags other nodes' events)."""
        if ev.get("node_rank") is not None:
            st.node_rank = whole(ev.get("node_rank"), st.node_rank or 0)
        if ev.get("host") and not st.host:
            st.host = as_text(ev["host"])

    def _on_phase(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        phase = as_text(ev.get("phase"))
        if phase == EXITING:  # not a start-up phase: the script body ended, the process is exiting
            st._exiting = True
            st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
            return
        if phase not in PHASES:
            raise Malformed(f"unknown phase {phase!r}")
        st.phase = phase
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
        self.phase_t.setdefault(phase, t)
        at = ev.get("step")  # "batch": the position it trains from (a resumed rank: its checkpoint's)
        if isinstance(at, int) and not isinstance(at, bool) and at > st.step and self.first_step_t is None:
            st.step = at
            st.epoch = epoch_number(ev.get("epoch"), st.epoch)

    def _on_rank_exited(self, ev, t) -> None:
        st = self.rank(ev.get("rank"))
        sig = ev.get("signal")
        st.exited = f"signal {sig}" if sig else f"exit {as_text(ev.get('exitcode'), '?')}"
        if st.failed_exit:
            self._log(t, "warning", st.rank, f"rank {st.rank} ended: {st.exited}")

    def _on_node_sample(self, ev, t) -> None:
        """A node's GPUs and host, once a second (node 0's supervisor writes every node's)."""
        gpus, node = ev.get("gpus"), ev.get("node_rank")
        if isinstance(node, bool) or not isinstance(node, int) or node < 0 or not isinstance(gpus, list):
            raise Malformed("node_sample without a node_rank or its gpus")
        stats = ev.get("host_stats")
        self.fleet.add(node, as_text(ev.get("host")), gpus, stats if isinstance(stats, dict) else None, t)

    def _on_node_lost(self, ev, t) -> None:
        """Node 0 stopped hearing a node's supervisor: the node, and its ranks, are gone."""
        node, ranks = ev.get("node_rank"), ev.get("ranks")
        if isinstance(node, bool) or not isinstance(node, int) or node < 0 or not isinstance(ranks, list):
            raise Malformed("node_lost without a node_rank or its ranks")
        text = as_text(ev.get("message")) or f"node {node} lost"
        self.lost_nodes[node] = text
        for r in ranks:
            st = self.rank(r)
            st.node_rank = node if st.node_rank is None else st.node_rank
            st.exited = st.exited or NODE_LOST
        lost_t = real(ev.get("lost_t"))  # logged where it happened: before what it did to the other ranks
        self._log(lost_t if lost_t is not None and lost_t <= t else t, "error", None, text)

    def startup(self, now: float) -> str | None:
        """What a starting run is doing, for the headers; None once it trains (or is over)."""
        if self.status != Status.STARTING:
            return None
        if self.started_t is None:
            return "starting the supervisor"
        ranks = [r for r in self.rank_list() if not r.from_report]
        moving = [r for r in ranks if r.phase]
        if not moving:
            return f"{kind_of(self).starting} ({now - self.started_t:.0f} s)"
        order = list(PHASES)
        behind = min(moving, key=lambda r: order.index(r.phase)).phase
        n = sum(r.phase == behind for r in moving)
        world = self.world_size or len(ranks)
        since = self.phase_t.get(behind, now)
        what = PHASES[behind]
        if behind == "rendezvous" and (self.num_nodes or 1) > 1:  # the wait a missing node makes
            what = f"waiting for all {self.num_nodes} nodes to meet"
        return f"{what} ({n}/{world} rank{'s' if world != 1 else ''}, {max(0.0, now - since):.0f} s)"

    def startup_breakdown(self) -> list[tuple[str, float]]:
        """Seconds from the supervisor's start to the first step, by phase (the first rank to enter
        each): where a short run's time goes before it trains."""
        if self.started_t is None:
            return []
        n = self.first_step
        first = kind_of(self).first_phase
        marks = [(first, self.started_t)] + [
            (name, self.phase_t[p]) for p, name in (("rendezvous", "rendezvous"), ("script", "script set-up"),
                                                    ("data", "data"),
                                                    ("model", "model"), ("resume", "checkpoint"),
                                                    ("batch", "first batch"),
                                                    ("steps", f"steps 1-{n}" if n > 1 else "step 1"),
                                                    ("step", "first step")) if p in self.phase_t]
        out = []
        for (what, t0), (_, t1) in zip(marks, marks[1:]):
            out.append((what, max(0.0, t1 - t0)))
        return out

    def rank_pids(self) -> dict:
        """pid -> rank for the run's processes (the supervisor as None), for the host and GPU panes."""
        out = {}
        if self.supervisor_pid:
            out[self.supervisor_pid] = None
        for st in self.rank_list():
            # another node's pid names some other process here: only this node's ranks
            mine = st.node_rank is None or st.node_rank == self.node_rank
            if st.pid and not st.from_report and mine:
                out[st.pid] = st.rank
        return out
