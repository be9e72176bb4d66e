"""Progress of a user's script, as `step` events on the rank's channel: optimizer steps counted
by torch.optim's global step hook (no change to the script), and `torchdeck.log` calls.

Both feed one state per process, so the two never disagree about the step. One rule for the
step number, as wandb.log(step=) and SummaryWriter's global_step have it: the script's own. Once a
rank's script passes `step=`, every step event of that rank carries the last step it passed (the
hook's events too, so its steps/s still shows and a stall is still seen); the hook's count is not
mixed in. Until then (and on a rank that never passes one) the step is the optimizer steps counted.
- The hook counts the steps of the first optimizer that steps (a GAN's second optimizer, or an
  optimizer wrapping another, is not counted twice; if that optimizer is garbage collected the
  next one to step is adopted). It sends a step event at the first step, then when a window of
  TORCHDECK_STEP_EVERY_S seconds (default 1.0) has passed and no step event was sent within it,
  and once more at exit (flush) if steps were done since the last one. Steps counted but not sent
  go out at the end of the window since the last event from the flusher thread below (a rank that
  stepped, then hung, showed its window's first step). steps_per_s is the rate over the last
  window (for those, up to the last step: not the hang after it).
- log() sends a step event at its first call, then at most one every TORCHDECK_LOG_EVERY_S
  seconds (default 0.05; 0: every call) with the newest call's numbers, samples/s and tokens/s
  over the calls since the last one sent. The numbers it holds meanwhile go out within that window
  whatever the script does next (a rank that logs, then hangs in a collective and is stopped,
  showed the step before its last): the next call, the next optimizer step or the exit sends
  them if the window has passed, else a daemon thread does at the window's end (the one
  background sender, for both sources; started at the first held call or optimizer step; it only ever waits on a condition and writes to the non-blocking pipe). No
  SIGTERM handler: Python runs one only between the main thread's bytecodes, so a rank stuck in
  a C++ collective would outlive its stop until SIGKILL; held numbers are at most one window old
  when the stop comes. Every event costs the node's
  supervisor CPU, on a host whose cores all train taken from the ranks: about 0.1 ms an event at
  the coalesced rate (the supervisor reads the pipes in rounds, engine/launch/ranks.py), 25 us at
  hundreds a second; a script logging every 10 ms step would still spend 1-1.5 % of a core on
  2 ranks' events sent one by one, 0.5 % coalesced (BENCHMARKS.md, launch_vs_torchrun).

Torch is never imported here: the hook is registered when the script imports torch.optim (see
install_step_hook). Stdlib only.
"""
from __future__ import annotations

import operator
import os
import sys
import threading
import time
import weakref

from . import channel

_OPTIMIZER_MODULE = "torch.optim.optimizer"


def _every_s(name: str = "TORCHDECK_STEP_EVERY_S", default: float = 1.0) -> float:
    try:
        v = float(os.environ.get(name, default))
    except ValueError:
        return default
    return v if v >= 0 and v == v else default


class _State:
    def __init__(self):
        self.every_s = _every_s()
        self.optimizer = None  # weakref to the optimizer whose steps count
        self.steps = 0  # optimizer steps counted
        self.win_t = 0.0  # monotonic start of the current rate window, and the count then
        self.win_steps = 0
        self.rate: float | None = None  # steps/s over the last closed window
        self.sent_t = None  # monotonic time of the last step event sent (either source)
        self.sent_steps = 0  # the step count in it
        self.log_calls = 0
        self.log_every_s = _every_s("TORCHDECK_LOG_EVERY_S", 0.05)
        self.log_t = None  # monotonic time of the last log() event sent
        self.pending = None  # the newest call's fields, not sent yet (coalesced)
        self.samples = self.tokens = None  # summed over the calls since the last event sent
        self.bad = 0  # metric values log() skipped, all calls together
        self.script_step = None  # the last step= the script passed: this rank's step from then on
        # guards pending/log_t/samples/tokens between log(), the hook and the flusher thread; an
        # RLock so that a signal handler calling log() inside log() cannot deadlock its own thread
        self.held = threading.Condition(threading.RLock())
        self.flusher = None  # the daemon thread sending held numbers at the window's end
        self.flusher_idle = False  # it waits for no deadline: the hook wakes it at an unsent step
        self.step_t = None  # monotonic time of the last optimizer step counted


_state = _State()


def _forked() -> None:
    """A forked child (a DataLoader worker, mp fork) is a reporter of its own: its first log()
    call goes out at once, not coalesced into the parent's window (whose end it may never reach:
    multiprocessing's children leave through os._exit, without the exit flush)."""
    _state.log_t, _state.pending, _state.samples, _state.tokens = None, None, None, None
    _state.held = threading.Condition(threading.RLock())  # the parent's may have been held at the fork
    _state.flusher = None  # threads do not survive a fork
    _state.flusher_idle = False
    _state.sent_steps = _state.steps  # the parent's steps are the parent's to send


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _step_now() -> int:
    """This rank's step: the script's own once it passed one, else the optimizer steps counted."""
    s = _state
    return s.script_step if s.script_step is not None else s.steps


def _send_step(now: float, **fields) -> None:
    _state.sent_t = now
    _state.sent_steps = _state.steps
    channel.emit("step", **fields)


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    """torch.optim's global post-step hook: runs after every optimizer.step() of the process."""
    try:
        s = _state
        mine = s.optimizer() if s.optimizer is not None else None
        if mine is None:
            s.optimizer = weakref.ref(optimizer)
        elif mine is not optimizer:
            return
        s.steps += 1
        now = s.step_t = time.monotonic()
        if s.pending is not None:
            _send_held(now)
        if s.steps == 1:
            s.win_t, s.win_steps = now, 1
            with s.held:
                _send_step(now, step=_step_now(), steps_per_s=None, epoch=None, loss=None)
                _start_flusher()
            return
        if now - s.win_t >= s.every_s:
            s.rate = (s.steps - s.win_steps) / (now - s.win_t)
            s.win_t, s.win_steps = now, s.steps
            if s.sent_t is None or now - s.sent_t >= s.every_s:
                with s.held:
                    if s.sent_t is None or now - s.sent_t >= s.every_s:
                        _send_step(now, step=_step_now(), steps_per_s=s.rate, epoch=None, loss=None)
        if s.flusher_idle and s.steps != s.sent_steps:  # steps not sent and the sender waits for none: wake it
            with s.held:
                s.held.notify()
    except Exception:  # noqa: BLE001 - never break the user's optimizer.step()
        pass


def flush() -> None:
    """At exit: one last step event if steps were done since the last one."""
    s = _state
    try:
        if s.pending is not None:  # log() numbers coalesced since the last event: they go now
            with s.held:
                if s.pending is not None:
                    _send_log(time.monotonic())
        if s.steps and s.steps != s.sent_steps:
            with s.held:
                _send_counted(time.monotonic())
    except Exception:  # noqa: BLE001
        pass


def _send_counted(now: float) -> None:
    """The optimizer steps counted since the last step event, as one (held by s.held). Its rate:
    the last window's, unless the one under way is long enough to say; measured up to the last
    step, so a rank that stepped then hung is not said to have slowed down."""
    s = _state
    if not s.steps or s.steps == s.sent_steps:
        return
    rate, end = s.rate, s.step_t or now
    if s.steps > s.win_steps and end > s.win_t and (rate is None or end - s.win_t >= s.every_s / 4):
        rate = (s.steps - s.win_steps) / (end - s.win_t)
    # sent after its last step (up to a window later, or at the exit after a failing collective):
    # its wall time, so a rank's mean pace is over its stepping time (engine/runs/view.py)
    step_t = time.time() - (now - s.step_t) if s.step_t is not None else None
    _send_step(now, step=_step_now(), steps_per_s=rate, epoch=None, loss=None, step_t=step_t)


def _register(module) -> None:
    try:
        module.register_optimizer_step_post_hook(_on_optimizer_step)
    except Exception:  # noqa: BLE001 - a torch without the global hook: no step counts
        pass


class _ThenRegister:
    """The real loader of a watched module, calling `then(module)` once the module ran."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:  # from here on the module looks as if it had been imported the usual way
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        except Exception:  # noqa: BLE001
            pass
        self._then(module)


class _ModuleWatch:
    """A meta path finder that only answers for one module (asked once, when the script first
    imports torch), and only to wrap the real loader; then it removes itself."""

    def __init__(self, fullname: str, then):
        self.fullname, self.then = fullname, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        try:
            finders = sys.meta_path
            i = finders.index(self)
            finders.remove(self)
        except ValueError:
            return None
        for finder in finders[i:]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenRegister(spec.loader, self.then)
        return spec


def _when_imported(fullname: str, then) -> None:
    """then(module) now if the module is imported already, else right after its import."""
    mod = sys.modules.get(fullname)
    if mod is not None:
        then(mod)
    else:
        sys.meta_path.insert(0, _ModuleWatch(fullname, then))


def install_step_hook() -> None:
    """Count optimizer steps: now if torch.optim is already imported, else when it is."""
    _when_imported(_OPTIMIZER_MODULE, _register)


def _phased_init(real):
    """init_process_group sending the rank's start-up phases around it: `rendezvous` while it
    waits for every rank (on several nodes, for the other nodes: that wait is not the torch
    import), then `script` (the script's own set-up, up to its first step)."""
    import functools

    @functools.wraps(real)
    def init_process_group(*args, **kwargs):
        channel.emit("phase", phase="rendezvous")
        try:
            return real(*args, **kwargs)
        finally:
            channel.emit("phase", phase="script")

    init_process_group.__torchdeck_phased__ = True
    return init_process_group


def _wrap_init(module) -> None:
    try:
        real = module.init_process_group
        if not getattr(real, "__torchdeck_phased__", False):
            module.init_process_group = _phased_init(real)
    except Exception:  # noqa: BLE001 - a torch without it: no phases, the script runs as it is
        pass


def install_phase_hook() -> None:
    """Say the rendezvous as its own start-up phase: torch.distributed.distributed_c10d's
    init_process_group wrapped as the module is loaded, before torch.distributed's
    `from .distributed_c10d import *` copies it (so `dist.init_process_group` is the wrapper).
    Torch already imported (a sitecustomize): torch.distributed's name is wrapped too."""
    c10d = "torch.distributed.distributed_c10d"
    if c10d in sys.modules:
        _wrap_init(sys.modules[c10d])
        if "torch.distributed" in sys.modules:
            _wrap_init(sys.modules["torch.distributed"])
        return
    _when_imported(c10d, _wrap_init)


_NOT_A_NUMBER = object()


def _number(value):
    """A metric as a float: ints, floats, 0-d tensors and numpy scalars (.item()); else
    _NOT_A_NUMBER. Bools are not numbers here."""
    if isinstance(value, bool):
        return _NOT_A_NUMBER
    if isinstance(value, (int, float)):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        x = value.item()  # a CUDA tensor: this waits for the GPU
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return float(x)
    return _NOT_A_NUMBER


def _step_number(step):
    """step= as an int: ints, numpy integers, integer 0-d tensors (__index__); None for anything
    else (bools, floats, None)."""
    if step is None or isinstance(step, bool):
        return None
    try:
        return operator.index(step)
    except Exception:  # noqa: BLE001 - a float, a string, a tensor that is not one integer
        return None


def _rate(amount, dt):
    if amount is None or dt is None or dt <= 0:
        return None
    n = _number(amount)
    return None if n is _NOT_A_NUMBER else n / dt


def _add(total, amount) -> tuple:
    """(the sum so far, 1 if `amount` was given but is not a number)."""
    if amount is None:
        return total, 0
    n = _number(amount)
    if n is _NOT_A_NUMBER:
        return total, 1
    return (total or 0.0) + n, 0


def _send_log(now: float) -> None:
    """The pending log() numbers as one step event: the rates over the time since the last one
    (none for the first: nothing to measure from before it)."""
    s = _state
    dt = now - s.log_t if s.log_t is not None else None
    fields = dict(s.pending, steps_per_s=s.rate, samples_per_s=_rate(s.samples, dt),
                  tokens_per_s=_rate(s.tokens, dt))
    s.log_t, s.pending, s.samples, s.tokens = now, None, None, None
    _send_step(now, **fields)


def _send_held(now: float) -> bool:
    """Send the held log() numbers if the window since the last log event has passed."""
    s = _state
    with s.held:
        if s.pending is None or s.log_t is None or now - s.log_t < s.log_every_s:
            return False
        _send_log(now)
        return True


def _due(s) -> float | None:
    """When the flusher must send next: held log() numbers at their window's end, optimizer steps
    counted but not sent at the end of the hook's window since the last step event; None: nothing."""
    due = s.log_t + s.log_every_s if s.pending is not None and s.log_t is not None else None
    if s.steps != s.sent_steps and s.sent_t is not None:
        hook = s.sent_t + s.every_s
        due = hook if due is None else min(due, hook)
    return due


def _flush_held() -> None:
    """The flusher thread, the one background sender: held log() numbers and the optimizer steps
    counted since the last step event go out at the end of their window if nothing sent them (a
    rank that stepped, then hung, showed the step of its window's start: step 1 after 29 quick
    steps)."""
    s = _state
    held = s.held
    while True:
        try:
            with held:
                s.flusher_idle = True  # before _due: a step counted after it sees this and notifies
                due = _due(s)
                while due is None:
                    held.wait()
                    due = _due(s)
                s.flusher_idle = False
                now = time.monotonic()
                if due > now:
                    held.wait(due - now)  # a call or a step meanwhile may send them itself: checked again
                    continue
                if not _send_held(now):
                    _send_counted(now)
        except Exception:  # noqa: BLE001 - never end the process's reporting on a bad event
            time.sleep(s.log_every_s or 0.05)


def _start_flusher() -> None:
    s = _state
    if s.flusher is None:
        s.flusher = threading.Thread(target=_flush_held, name="torchdeck-log-flush", daemon=True)
        s.flusher.start()


def log(metrics, step=None, samples=None, tokens=None) -> None:
    """One step event with the script's own numbers (torchdeck.log: see its docstring)."""
    try:
        ch = channel.get()
        if ch is None or ch.closed:
            return
        loss, values, skipped = _metrics(metrics)  # outside the lock: .item() may wait for a GPU
        s = _state
        with s.held:
            _hold(s, loss, values, skipped, step, samples, tokens)
    except Exception:  # noqa: BLE001 - never raise into the user's training loop
        _state.bad += 1


def _metrics(metrics) -> tuple:
    """(loss, the other numbers by name, how many values were skipped)."""
    loss, values, skipped = None, {}, 0
    for key, value in (metrics.items() if isinstance(metrics, dict) else ()):
        try:
            x = _number(value)
        except Exception:  # noqa: BLE001 - a tensor that cannot be read
            x = _NOT_A_NUMBER
        if x is _NOT_A_NUMBER:
            skipped += 1
        elif key == "loss":
            loss = x
        else:
            values[str(key)] = x
    if not isinstance(metrics, dict):
        skipped += 1
    return loss, values, skipped


def _hold(s, loss, values, skipped, step, samples, tokens) -> None:
    """This call's numbers become the held ones; sent now if the window has passed."""
    now = time.monotonic()
    s.log_calls += 1
    given = _step_number(step)
    if given is None:
        if step is not None:
            skipped += 1
        step = s.script_step if s.script_step is not None else s.steps or s.log_calls
    else:
        step = s.script_step = given  # the script's numbering from here on (module docstring)
    s.samples, bad_s = _add(s.samples, samples)
    s.tokens, bad_t = _add(s.tokens, tokens)
    skipped += bad_s + bad_t
    was_held = s.pending is not None
    s.pending = dict(step=step, epoch=None, loss=loss, metrics=values)
    if skipped:
        s.bad += skipped
        s.pending["skipped"] = skipped
    if s.log_t is None or now - s.log_t >= s.log_every_s:
        _send_log(now)
    elif not was_held:  # newly held: the flusher sends them at the window's end if nothing else does
        if s.flusher is None:
            _start_flusher()
        s.held.notify()
