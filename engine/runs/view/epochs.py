"""Epochs and evaluation: epoch_end events, the resumed run's history, and the metrics read from them."""
from __future__ import annotations

from ...events import epoch_number
from .. import metric
from ... import fmt
from .parse import numbers, rank_of, real, whole
from .records import EpochPoint, epoch_text


class Epochs:
    """RunView's epoch reducers and metric queries (a mixin: they read and write the view's fields)."""

    def _on_epoch_end(self, ev, t) -> None:
        r = rank_of(ev.get("rank", -1) if ev.get("rank") is not None else -1)
        epoch = epoch_number(ev.get("epoch"), 1)
        st = self.rank(r)
        st.epoch = max(st.epoch, epoch)
        st.last_seen = t if st.last_seen is None else max(st.last_seen, t)
        val_acc = real(ev.get("val_acc"))
        if val_acc is not None:
            st.val_acc = val_acc
        have = self.epochs.get(epoch)
        if have is None or r == 0:
            p = self.epochs[epoch] = EpochPoint(epoch, whole(ev.get("step")), real(ev.get("train_loss")),
                                                real(ev.get("train_acc")), real(ev.get("val_loss")), val_acc,
                                                t, r, numbers(ev.get("val_metrics")), numbers(ev.get("train_metrics")))
            self._best(p)
            self.curve_version += 1
            if have is None:
                of = f"/{self.total_epochs}" if self.total_epochs else ""
                self._log(t, "info", None, f"epoch {epoch}{of} done at step {p.step}: {epoch_text(p)}")

    def _best(self, p: EpochPoint) -> None:
        if p.val_acc is not None or p.train_acc is not None:
            self.has_accuracy = True
        if p.val_acc is not None and (self.best_val_acc is None or p.val_acc > self.best_val_acc):
            self.best_val_acc = p.val_acc
        if p.val_loss is not None and (self.best_val_loss is None or p.val_loss < self.best_val_loss):
            self.best_val_loss = p.val_loss

    def add_history(self, evs, upto_step: int, source: str) -> None:
        """The curves of the run this one resumed (steps up to its checkpoint), so a resumed run's
        loss and accuracy continue where they left off, and its ranks start at that step (the last
        call's: the run it continues directly). Nothing else of that run comes along."""
        self.start_step = max(0, whole(upto_step))
        for st in self.ranks.values():
            st.step = max(st.step, self.start_step)
        n = 0
        for ev in evs:
            if not isinstance(ev, dict):
                continue
            kind = ev.get("kind")
            try:
                if kind == "step" and ev.get("rank") == 0 and whole(ev.get("step"), upto_step + 1) <= upto_step:
                    loss, acc = real(ev.get("loss")), real(ev.get("accuracy"))
                    if loss is not None:
                        self.steps.add(whole(ev.get("step")), loss)
                        if self.step_t is not None:
                            self.step_t.add(whole(ev.get("step")), (real(ev.get("t")), 0))
                        n += 1
                    if acc is not None:
                        self.step_acc.add(whole(ev.get("step")), acc)
                elif kind == "epoch_end" and ev.get("rank") in (0, None) and whole(ev.get("step"), upto_step + 1) <= upto_step:
                    epoch = epoch_number(ev.get("epoch"), 1)
                    p = self.epochs.setdefault(epoch, EpochPoint(
                        epoch, whole(ev.get("step")), real(ev.get("train_loss")), real(ev.get("train_acc")),
                        real(ev.get("val_loss")), real(ev.get("val_acc")), val_metrics=numbers(ev.get("val_metrics")),
                        train_metrics=numbers(ev.get("train_metrics"))))
                    self._best(p)
            except (TypeError, ValueError, OverflowError):
                continue
        if n:
            self._curve_rank = 0
            self.curve_version += 1
            self.version += 1

    def latest(self, name: str) -> float | None:
        """The newest epoch's value of a metric: val_acc, val_loss, perplexity, a loss callable's own."""
        for k in sorted(self.epochs, reverse=True):
            v = metric.point_value(self.epochs[k], name)
            if v is not None:
                return v
        return None

    def latest_val_acc(self) -> float | None:
        return self.latest(metric.ACC)

    def main_metric(self) -> str | None:
        """The run's main validation metric (engine.runs.metric.main_of, the one rule): val_acc for
        classification, else val_loss; None before its first evaluation."""
        return metric.main_of(self.epochs.values())

    def main(self) -> tuple[str, float, float | None] | None:
        """(main metric, its newest value, its best where better than the newest) or None."""
        name = self.main_metric()
        value = None if name is None else self.latest(name)
        if value is None:
            return None
        if name == metric.ACC:
            best = self.best_val_acc if self.best_val_acc is not None and self.best_val_acc > value + 1e-9 else None
        else:
            best = self.best_val_loss if self.best_val_loss is not None and self.best_val_loss < value - 1e-9 else None
        return name, value, best

    def main_text(self) -> str:
        """The main metric in words: 'val acc 93.4% (best 95.0%)', 'val loss 1.6021 (best 1.5900)'
        with the perplexity where the run reports one; "" before its first evaluation."""
        m = self.main()
        if m is None:
            return ""
        name, value, best = m
        out = f"{metric.label(name)} {metric.show(name, value)}" + (f" (best {metric.show(name, best)})" if best is not None else "")
        ppl = self.latest("perplexity") if name == metric.LOSS else None
        return out + (f", perplexity {metric.show('perplexity', ppl)}" if ppl is not None else "")

    def reached(self, target) -> float | None:
        """Seconds from the run's start to the first epoch end (rank 0's or the supervisor's) whose
        metric meets `target` (a metric.Target, its text `val_loss<=1.6`, or a validation accuracy
        as a number); None if none does, or the start is unknown."""
        target = metric.parse_target(target)
        if self.started_t is None:
            return None
        for k in sorted(self.epochs):
            p = self.epochs[k]
            if p.rank in (0, -1) and p.t is not None and target.met(metric.point_value(p, target.name)):
                return max(0.0, p.t - self.started_t)
        return None

    def metrics_now(self) -> dict:
        """The extra metrics the curve's rank sent last ({name: value}), for the headers."""
        st = self.ranks.get(self._curve_rank) if self._curve_rank is not None else None
        return dict(st.metrics) if st is not None else {}

    def metrics_text(self, n: int = 4) -> str:
        """metrics_now in words, saying whose they are: `rank 0 last: mae 0.31  lr 0.01` (one
        rank's newest batch or log() call, not an average over the ranks or the epoch)."""
        extra = self.metrics_now()
        if not extra:
            return ""
        said = "  ".join(f"{metric.label(k)} {fmt.num(v, '.4g')}" for k, v in list(extra.items())[:n])
        return f"rank {self._curve_rank} last: {said}"
