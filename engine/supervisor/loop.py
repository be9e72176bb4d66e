"""The supervisor's main loop: read the run's config, plan, start the ranks, wait for them while
passing on stop requests and minding the watchdog, and record how the run ended (status.json)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from .. import events, strategies, usercode
from ..errors import TorchdeckError
from ..kinds import kind_of
from ..rundir import stacks
from ..rundir.config import load_validated
from ..rundir.layout import RunDir
from ..rundir.status import Status
from .nodes import NodeLink
from .outcome import Outcome, cannot_write, signal_text
from .plan import announce, make_plan
from .ranks import kill_all, spawn, start_script, terminate, wait_step
from .watchdog import Watchdog
from .writer import EventWriter

STOP_GRACE_S = 30.0
RESERVE_BYTES = 64 << 10
SIGNAL_COALESCE_S = 0.5
LOST_GRACE_S = 0.5  # a node lost: its peers' collectives fail at once, so their errors are in (or never come)


def _open_metrics(writer: EventWriter, cfg, rd: RunDir) -> str | None:
    """metrics.csv beside events.jsonl (and TensorBoard when asked); the line to log, if any."""
    from ..metrics import MetricsSink

    try:
        writer.metrics = MetricsSink(rd.metrics_path, rd.tensorboard_dir if cfg.logging.tensorboard else None)
    except OSError as exc:
        return f"metrics.csv not written: {cannot_write(rd.metrics_path, exc)}"
    if writer.metrics.note:
        print(writer.metrics.note, flush=True)
    return writer.metrics.note


class Supervisor:
    def __init__(self, run_dir):
        self.rd = RunDir(Path(run_dir))
        self.stop_requests = 0
        self._signal_t = float("-inf")  # the last stop signal (request_stop)
        self.first_stop_t: float | None = None
        self.started = time.time()
        self.write_failure: str | None = None
        self.script = False  # strategy script: the user's own script (torchdeck launch)
        self.stop_grace_s = STOP_GRACE_S  # a stop's SIGKILL comes this long after it (script.stop_grace_s)
        self.writer: EventWriter | None = None
        self.link = NodeLink(self.rd, self.started)
        self.ended_for_lost = False  # node 0 ended its ranks because a node was lost (NodeLink.lost)
        self.watchdog = Watchdog(self.rd, self.link.write)
        self.outcome = Outcome(self.rd, False, None, self.watchdog.where)
        self.restarts = 0  # attempts restarted after a failure (train.max_restarts)
        self.attempt_t = self.started  # when this attempt's ranks started

    # ---------------------------------------------------------------- stop requests
    def request_stop(self, *_):
        """SIGTERM/SIGINT: a stop; a second one (seconds later) kills. Signals within
        SIGNAL_COALESCE_S of the last are one request: one keypress or `kill` of a process group
        can deliver the same stop twice."""
        now = time.monotonic()
        if now - self._signal_t >= SIGNAL_COALESCE_S:
            self.stop_requests += 1
            self._signal_t = now

    def request_preempt(self, *_):
        """SLURM is about to preempt the job (or its time is up): stop with a checkpoint, as
        status 'preempted', so a requeued job resumes from it (`torchdeck resume`)."""
        try:
            self.rd.preempt_path.touch()
        except OSError:
            pass
        self.stop_requests = max(self.stop_requests, 1)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGUSR1, self.request_preempt)  # SLURM's warning (--signal=USR1@120)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the run outlives the terminal

    # ---------------------------------------------------------------- the run's start and end
    def _reserve(self) -> None:
        """Hold RESERVE_BYTES of real disk in the run directory while the run lives: when the disk
        fills up, releasing it leaves room for the final status (and the log line saying why)."""
        try:
            with open(self.rd.reserve_path, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self.release_reserve()

    def release_reserve(self) -> None:
        try:
            self.rd.reserve_path.unlink(missing_ok=True)
        except OSError:
            pass

    def _finish(self, writer, status: Status, exit_codes, root_cause) -> int:
        self.release_reserve()
        try:
            print(f"run {status.value}" + (f": {root_cause}" if root_cause else ""), flush=True)
        except OSError:
            pass  # supervisor.log on the disk that is full
        first = self.outcome.failed_local_rank if status is Status.FAILED else None
        self.rd.write_final(status, root_cause, exit_codes, round(time.time() - self.started, 3),
                            emit=writer.write if writer is not None else None,
                            **({} if first is None else {"failed_local_rank": first}))
        return 0 if status.ended_well else 1

    def _read_config(self):
        """The run's config and what this host decides for it; TorchdeckError/OSError if it cannot start.
        The config was validated where it was made: read back, not judged again (engine/rundir/config.py)."""
        rd = self.rd
        cfg = load_validated(rd.config_path)
        usercode.add_folders(*usercode.run_folders(rd.path))  # the user's module:callable: where it
        usercode.extend_path()  # was launched from, and its preset's folder; spawned ranks inherit sys.path
        if kind_of(cfg).ranks_from_shim:
            self.script, self.stop_grace_s = True, float(cfg.script.stop_grace_s)
        self.watchdog.script = self.script
        self.outcome = Outcome(rd, self.script, cfg.nodes.timeout_s, self.watchdog.where)
        return cfg, make_plan(cfg, rd, self.script)

    def run(self) -> int:
        self._install_signals()
        rd = self.rd
        rd.write_pid(os.getpid())
        self._reserve()
        try:
            stacks.install(rd.stacks_path(None))
        except OSError:
            pass  # an unwritable run directory fails below, with its message
        try:
            cfg, plan = self._read_config()
        except (TorchdeckError, OSError) as exc:  # a bad config, a taken port, a missing ds_config
            return self._finish(None, Status.FAILED, [], str(exc))
        writer = self.writer = EventWriter(rd.events_path, None)
        metrics_note = _open_metrics(writer, cfg, rd)
        if metrics_note:
            plan.notes = [*plan.notes, ("warning", metrics_note)]
        announce(cfg, plan, rd, writer)
        if writer.write_error is not None:  # unwritable run directory: start nothing
            writer.close()
            if plan.store is not None:
                plan.store.sock.close()
            return self._finish(None, Status.FAILED, [],
                                f"{cannot_write(rd.events_path, writer.write_error)}; nothing was started")
        self.link.open(cfg, plan.port, writer)
        while True:
            try:
                ranks, stop_event = self._start(cfg, plan, writer)
            except OSError as exc:  # no_python: the executable cannot be run
                self.link.close()
                self.link.bye()
                if writer.is_alive():
                    writer.stop()
                writer.close()
                return self._finish(None, Status.FAILED, [], f"cannot start the ranks: {exc}")
            ended = self._collect(ranks, stop_event)
            status, cause = self._decide(ended, writer)
            if not self._restart_due(cfg, status):
                return self._conclude(ranks, ended, status, cause, writer)
            self._restart(cfg, ended, cause, writer)
            plan = make_plan(cfg, rd, self.script)  # a port (and store) of its own: the last went with its ranks

    def _start(self, cfg, plan, writer):
        """Start the node's ranks (again, on a restart: our loop from the newest checkpoint)."""
        start = start_script if self.script else spawn
        ranks, stop_event = start(cfg, plan, self.rd, writer, self.link.put, attempt=self.restarts)
        self.attempt_t = time.time()
        if self.restarts == 0:
            self.watchdog.base = self.outcome.base = cfg.nodes.node_rank * strategies.nproc_per_node(cfg)
            self.link.start()  # the writer's queue exists now
        return ranks, stop_event

    def _collect(self, ranks, stop_event):
        """Wait for the ranks; (exit codes, the ranks that died first, a reported stop cause)."""
        try:
            died_first, reported = self._join(ranks, stop_event, self.writer)
        finally:  # even when the supervisor itself fails, no rank outlives it
            for p in ranks.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
            ranks.finish()
        return [p.exitcode for p in ranks.processes], died_first, reported

    def _stopping(self) -> bool:
        return self.first_stop_t is not None or self.rd.stop_path.exists()  # a stop asked on another node too

    def _decide(self, ended, writer):
        codes, died_first, reported = ended
        status, cause = self.outcome.decide(codes, died_first, reported, self._stopping(), self.write_failure,
                                            writer.errors)
        lost = self.link.lost_cause() if status is Status.FAILED else None
        if lost:  # a node died: its end is why, what this node's ranks said of it follows
            cause = self.outcome.after_lost(lost, cause, self.ended_for_lost and not writer.errors)
        return status, cause

    def _exited(self, codes) -> None:
        for i, code in enumerate(codes):
            self.link.write(events.make("rank_exited", rank=self.outcome.base + i, exitcode=code,
                                        signal=signal_text(code)))

    def _conclude(self, ranks, ended, status, cause, writer: EventWriter) -> int:
        """Record how each rank ended and the run's outcome."""
        codes = ended[0]
        self.link.close()  # the other nodes' last events, into the queue before it is drained
        writer.stop()  # every rank is gone: what they sent is in the pipe; drain it first
        self._exited(codes)
        self.link.bye()
        quote = self.outcome.quote_event(ranks.processes) if status is Status.FAILED else None
        if quote is not None:
            self.link.write(quote)
        records = self.rd.flight_records() if status is Status.FAILED else []
        if records:  # NCCL's watchdog dumped what each rank's last collectives were (a GPU timeout)
            cause = f"{cause}; NCCL flight recorder: {', '.join(p.name for p in records)} in {self.rd.path}"
        try:
            return self._finish(writer, status, codes, cause)
        finally:
            writer.close()

    # ---------------------------------------------------------------- restarts (train.max_restarts)
    def _restart_due(self, cfg, status: Status) -> bool:
        """A failure, not a stop (the user's, a full disk's, a preemption's): restarted while
        restarts are left. A kill by the user takes this process with it: nothing to restart."""
        return (status is Status.FAILED and self.restarts < cfg.train.max_restarts and not self._stopping()
                and self.write_failure is None)

    def _restart(self, cfg, ended, cause, writer) -> None:
        """One more attempt of the same run: the failed one's ends and a `restart` event, then our
        loop resumes from the newest checkpoint (a script starts over, as torchrun's)."""
        self._exited(ended[0])
        self.restarts += 1
        now, found = time.time(), None if self.script else self.rd.newest_checkpoint()
        lost_from = self.attempt_t
        if found is not None:
            cfg.checkpoint.resume = str(found[1])
            try:
                lost_from = max(lost_from, found[1].stat().st_mtime)
            except OSError:
                pass
        writer.write(events.make(
            "restart", rank=None, attempt=self.restarts, max_restarts=cfg.train.max_restarts, cause=cause,
            lost_s=round(max(0.0, now - lost_from), 3), resume_step=None if self.script else (found or (0,))[0],
            checkpoint=None if found is None else str(found[1])))
        writer.errors.clear()  # the next attempt's root cause is its own
        self.outcome.failed_local_rank = None
        self.watchdog.where.clear()  # stacks of the ranks that are gone

    # ---------------------------------------------------------------- while the ranks run
    def _join(self, pctx, stop_event, writer):
        """Wait for the ranks; pass on stop requests; on the first failure stop the rest.

        A ctx.join(timeout) loop in spirit, polling the sentinels itself so that it knows which
        ranks died on their own before it terminated the others (the root cause is among them)."""
        sentinels = {p.sentinel: i for i, p in enumerate(pctx.processes)}
        while True:
            self._take_stop_requests(writer)
            if self.stop_requests and self.first_stop_t is None:
                self.first_stop_t = time.monotonic()
                stop_event.set()
                writer.write(events.make("log", rank=None, level="info", message=self._stop_said()))
            if self._stop_overdue():
                return [], self._kill_all(pctx, writer)
            self.watchdog.check(pctx, writer, stopping=self.first_stop_t is not None)
            if self.link.lost and self.first_stop_t is None:  # the job cannot go on without that node
                self.ended_for_lost = True
                writer.write(events.make("log", rank=None, level="warning",
                                         message=f"{self.link.lost[0]}: ending this node's ranks"))
                terminate(pctx, wait_s=LOST_GRACE_S)
                return [], None
            failed = wait_step(pctx, sentinels)
            if failed:
                # Which ranks died on their own, before we terminate the rest: the root cause is among them.
                failed += [i for i, p in enumerate(pctx.processes)
                           if i not in failed and p.exitcode not in (0, None)]
                self.watchdog.on_failure(pctx, writer)
                terminate(pctx)
                return failed, None
            if not sentinels:
                return [], None

    def _take_stop_requests(self, writer) -> None:
        """A stop file (torchdeck stop, the app), and an events file that cannot be written (a full
        disk), count as a stop request: the ranks checkpoint and leave."""
        if self.rd.stop_path.exists() and self.stop_requests == 0:
            self.stop_requests = 1
        if writer.write_error is not None and self.write_failure is None:
            self.write_failure = cannot_write(self.rd.events_path, writer.write_error)
            try:
                print(f"cannot write {self.rd.events_path}: stopping the run", file=sys.stderr, flush=True)
            except OSError:
                pass
            self.stop_requests = max(self.stop_requests, 1)

    def _stop_said(self) -> str:
        if self.script:
            return (f"stop requested: SIGTERM to the ranks, SIGKILL to their process trees in "
                    f"{self.stop_grace_s:g} s (a second stop: now)")
        return "stop requested: ranks finish this step, rank 0 checkpoints"

    def _stop_overdue(self) -> bool:
        return self.first_stop_t is not None and (
            self.stop_requests > 1 or time.monotonic() - self.first_stop_t > self.stop_grace_s)

    def _kill_all(self, pctx, writer) -> str:
        """A second stop request, or no exit within STOP_GRACE_S: kill every rank; returns why, the run's cause."""
        why = "second stop request" if self.stop_requests > 1 else f"no exit {self.stop_grace_s:g} s after stop"
        writer.write(events.make("log", rank=None, level="warning", message=f"{why}: killing the ranks"))
        kill_all(pctx)
        return f"killed after {why}"


def supervise(run_dir) -> int:
    """Run to the end; whatever goes wrong in the supervisor itself still ends in a status."""
    sup = Supervisor(run_dir)
    try:
        return sup.run()
    except Exception as exc:  # unwritable run dir, disk full, a broken install...
        import traceback

        cause = f"supervisor: {type(exc).__name__}: {exc}"
        sup.release_reserve()
        try:
            traceback.print_exc()
            print(f"run failed: {cause}", file=sys.stderr, flush=True)
        except OSError:
            pass
        try:
            sup.rd.write_final(Status.FAILED, cause, [], round(time.time() - sup.started, 3))
        except OSError:
            pass
        return 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torchdeck.engine.supervisor RUN_DIR", file=sys.stderr)
        return 2
    return supervise(argv[0])
