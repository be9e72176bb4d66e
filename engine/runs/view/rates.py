"""The run's rates and rank balance, as every front end says them."""
from __future__ import annotations

from ... import fmt
from ..fleet import multi_node, node_of
from .records import BALANCE_MIN_STEPS, RankState


class Rates:
    """RunView's rates and balance (a mixin over the view's fields)."""

    def global_samples_per_s(self, now: float | None = None) -> float:
        """The ranks' latest rates added up; 0 once over, and 0 while a rank is stale (the others
        wait for it in the next collective, whatever their last figure said)."""
        if self.final or (now is not None and self.stale_ranks(now)):
            return 0.0
        return sum(r.samples_per_s for r in self.rank_list() if r.exited is None)

    def mean_samples_per_s(self) -> float:
        """The whole run's training rate: each rank's mean over its step windows, added up
        (evaluation and checkpoints are not in the windows' rates)."""
        return sum(r.mean_samples_per_s for r in self.rank_list() if not self.ended_badly(r))

    def script_pace(self, now: float | None = None) -> float | None:
        """A script run's pace: the slowest rank's optimizer steps/s (the ranks of one job meet in
        each collective); while it runs its latest window's, None while a rank is stale (the others
        wait for it); once over, its mean over the run (RankState.settle). None before a window."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and (r.exited is None or self.final)]
        rates = [r.steps_per_s for r in ranks if r.steps_per_s is not None]
        if not rates or (not self.final and now is not None and self.stale_ranks(now)):
            return None
        return min(rates)

    def script_balance(self) -> dict | None:
        """A script run's rank balance from its ranks' optimizer steps/s (the step hook's): None
        where no rank timed a step (a hang before its first window, a legacy run: nothing to say);
        `enough` only once every compared rank has done BALANCE_MIN_STEPS steps, the least that
        says one is behind (a 6-step run's ranks, stepping together, read 13% apart)."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and r.steps_per_s]  # a stop's SIGTERM counts
        if not ranks:
            return None
        out = {"timing": len(ranks), "world": self.world_size or len(self.rank_list())}
        if len(ranks) >= 2:
            slow, fast = min(ranks, key=lambda r: r.steps_per_s), max(ranks, key=lambda r: r.steps_per_s)
            out.update(slow=slow, fast=fast, gap=100 * (1 - slow.steps_per_s / fast.steps_per_s),
                       enough=min(r.step for r in ranks) >= BALANCE_MIN_STEPS)
        return out

    def script_pace_text(self, now: float | None = None) -> str:
        """script_pace in words, for `torchdeck launch`/`attach` and the Monitor's header (the one
        way steps/s is written: fmt.steps_rate)."""
        pace = self.script_pace(now)
        return f"{'mean ' if self.final and pace is not None else ''}{fmt.steps_rate(pace)} steps/s"

    def rate_text(self, now: float | None = None) -> str:
        """The headers' rate: the ranks' latest while it trains, the run's mean once it is over
        (a finished run's header said `0 samples/s`)."""
        mean = self.mean_samples_per_s() if self.final else 0.0
        if mean > 0:
            return f"mean {fmt.rate(mean)} samples/s"
        return f"{fmt.rate(self.global_samples_per_s(now))} samples/s"

    def tokens_per_s(self, now: float | None = None) -> float | None:
        """The ranks' tokens/s added up while it trains (their means once it is over); None where
        no rank counts tokens (batches without token ids)."""
        ranks = [r for r in self.rank_list() if r.tokens_per_s is not None]
        if not ranks:
            return None
        if self.final:
            return sum(r.mean_tokens_per_s for r in ranks if not self.ended_badly(r))
        if now is not None and self.stale_ranks(now):
            return 0.0
        return sum(r.tokens_per_s for r in ranks if r.exited is None)

    def mfu(self) -> float | None:
        """The ranks' model FLOPs utilization, averaged (each rank is one GPU); None where the run
        does not report it (not compiled, on the CPU, a GPU or model the table does not know)."""
        vals = [r.mfu for r in self.rank_list() if r.mfu is not None and not self.ended_badly(r)]
        return sum(vals) / len(vals) if vals else None

    def rank_spread(self) -> tuple[RankState, RankState] | None:
        """(slowest, fastest) rank by samples/s (their last figures, once the run is over)."""
        live = [r for r in self.rank_list() if not self.ended_badly(r) and r.samples_per_s > 0
                and (r.exited is None or self.final)]
        if len(live) < 2:
            return None
        return min(live, key=lambda r: r.samples_per_s), max(live, key=lambda r: r.samples_per_s)

    BALANCED = 0.10  # ranks whose all-reduce waits differ by less than this share are even

    def balance(self) -> dict | None:
        """Where the time goes, and which rank holds the others back. The gradient all-reduce evens
        the ranks out, so the slow one is not the one with the lowest rate: it is the one the
        others wait for, the rank that waits least in the all-reduce. Its dominant cause is data
        (waiting for batches) or compute. None until two ranks report their all-reduce time."""
        ranks = [r for r in self.rank_list() if not self.ended_badly(r) and r.comm_wait is not None
                 and r.data_wait is not None and (r.exited is None or self.final)]
        if len(ranks) < 2:
            return None
        slow = min(ranks, key=lambda r: (r.comm_wait, -r.data_wait))
        waiter = max(ranks, key=lambda r: r.comm_wait)
        data, comm = slow.data_wait, slow.comm_wait
        compute = max(0.0, 1.0 - data - comm)
        return {"rank": slow.rank, "cause": "data" if data >= compute else "compute", "data": data,
                "compute": compute, "comm": comm, "waiter": waiter.rank, "waits": waiter.comm_wait,
                "even": waiter.comm_wait - slow.comm_wait < self.BALANCED}

    def balance_line(self) -> str | None:
        """One line for both front ends; None when the ranks do not measure their all-reduce."""
        b = self.balance()
        if b is None:
            return None
        split = f"data {b['data']:.0%}, compute {b['compute']:.0%}, all-reduce {b['comm']:.0%}"
        many = multi_node(self)  # across nodes: which node the rank is on

        def who(r: int) -> str:
            return f"rank {r} (node {node_of(self.ranks[r])})" if many else f"rank {r}"

        if b["even"]:
            return f"rank balance: even ({who(b['rank'])}: {split})"
        return (f"{who(b['rank'])} holds the others back: mostly {b['cause']} ({split}); "
                f"{who(b['waiter'])} waits {b['waits']:.0%} of its time in the all-reduce")
