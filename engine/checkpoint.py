"""Checkpoint files: atomic writes, keep-last-K, finding the newest complete one, RNG capture.

Files hold only tensors, containers and plain values so they load with
`torch.load(weights_only=True)`: a checkpoint from elsewhere cannot run code on load.
"""
from __future__ import annotations

import errno
import os
import random
import re
import socket
from pathlib import Path

import numpy as np
import torch

from .errors import TorchdeckError
from .procs import pid_alive
from .rundir.layout import CHECKPOINT_META as META_NAME, RunDir, checkpoint_name, checkpoint_step, checkpoints_in

FORMAT = 1
_TMP = re.compile(r"^\.(?P<name>.+?)\.tmp-(?P<host>.+)-(?P<pid>\d+)$")  # save()'s temp file: .<final name>.tmp-<host>-<pid>


class CheckpointWriteError(TorchdeckError, OSError):
    """Disk full, over quota, file too large, read-only: said in one line with what to do."""


def file_name(step: int) -> str:
    return checkpoint_name(step)


def dir_name(step: int) -> str:
    return checkpoint_name(step, folder=True)


def checkpoint_dir(cfg, run_dir) -> Path:
    return RunDir(run_dir).checkpoints_at(cfg)


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sweep_stale(directory: str | Path) -> list[Path]:
    """Remove temp files left by a writer killed mid-save (its pid is gone from this host).
    Another host's temp files (a shared file system) are left alone: its pids mean nothing here."""
    directory, host, gone = Path(directory), socket.gethostname(), []
    for p in directory.iterdir() if directory.is_dir() else []:
        m = _TMP.match(p.name)
        if m and checkpoint_step(m["name"]) and m["host"] == host and not pid_alive(int(m["pid"])):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def save(state: dict, directory: str | Path, step: int, keep_last: int) -> Path:
    """Write atomically (tmp in the same dir, fsync, rename, fsync dir), then prune old ones.
    A kill at any point leaves the earlier checkpoints as they were: `latest` never sees a temp file."""
    directory = Path(directory)
    final = directory / file_name(step)
    tmp = directory / f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        sweep_stale(directory)
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        os_error = _os_error(exc)
        if os_error is not None and not isinstance(exc, CheckpointWriteError):
            raise _write_error(os_error, final) from exc
        raise
    _fsync_dir(directory)
    prune(directory, keep_last)
    return final


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind a failed save: torch.save's zip writer hides it behind a RuntimeError
    ("unexpected pos") raised while closing, with the real one as its context."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def disk_hint(code: int | None) -> str:
    """What to do about a failed write, by errno (shared with the supervisor's events file)."""
    return {errno.ENOSPC: "free space on that disk",
            errno.EDQUOT: "free space within your quota",
            errno.EFBIG: "raise the file size limit (ulimit -f)",
            errno.EROFS: "make that file system writable",
            errno.EACCES: "make that folder writable"}.get(code, "check that disk")


def write_error(exc: BaseException, final: Path) -> BaseException:
    """The error to raise for a failed save: one line with what to do when a disk error is behind it."""
    os_error = _os_error(exc)
    if os_error is None or isinstance(exc, CheckpointWriteError):
        return exc
    return _write_error(os_error, final)


def _write_error(exc: OSError, final: Path) -> CheckpointWriteError:
    code = getattr(exc, "errno", None)
    why = getattr(exc, "strerror", None) or str(exc)
    hint = disk_hint(code)
    try:
        kept = [p.name for _, p in listing(final.parent)]
    except OSError:
        kept = []
    have = f"; the last complete checkpoint, {kept[-1]}, is intact" if kept else "; no earlier checkpoint exists"
    err = CheckpointWriteError(f"cannot write checkpoint {final}: {why}: {hint}, or set checkpoint.dir "
                               f"to another disk{have}")
    err.errno = code
    return err


def listing(directory: str | Path, dirs: bool = False) -> list[tuple[int, Path]]:
    """Finished checkpoints, oldest first: files, or (dirs) directories holding their META_NAME."""
    return checkpoints_in(directory, dirs)


def prune(directory: str | Path, keep_last: int, dirs: bool = False) -> None:
    import shutil

    for _, p in listing(directory, dirs)[:-keep_last] if keep_last > 0 else []:
        try:
            if dirs:
                (p / META_NAME).unlink()  # incomplete from here on: `latest` no longer sees it
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            pass


def load(path: str | Path, map_location="cpu") -> dict:
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError(f"{path} is not a torchdeck checkpoint (no model/step)")
    return state


def load_meta(path: str | Path) -> dict:
    """A checkpoint directory's META_NAME (weights_only, like every file torchdeck reads)."""
    state = torch.load(Path(path) / META_NAME, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "step" not in state or "config" not in state:
        raise ValueError(f"{path} is not a torchdeck checkpoint directory (no step/config in {META_NAME})")
    return state


def _load(path: Path, dirs: bool) -> dict:
    return load_meta(path) if dirs else load(path)


def latest(directory: str | Path, dirs: bool = False) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads; a damaged newest file falls back to the one before."""
    for _, p in reversed(listing(directory, dirs)):
        try:
            return p, _load(p, dirs)
        except Exception:
            continue
    return None


def resolve_resume(cfg, run_dir, dirs: bool = False) -> tuple[Path, dict] | None:
    """What `checkpoint.resume` points at; None when there is nothing to resume from.
    dirs: the strategy's checkpoints are directories (deepspeed), not files."""
    r = cfg.checkpoint.resume
    if not r:
        return None
    if r == "latest":
        found = latest(checkpoint_dir(cfg, run_dir), dirs)
        if found is None and not cfg.checkpoint.dir:
            found = latest_of_earlier_runs(cfg, run_dir, dirs)
        return found
    p = Path(r).expanduser()
    if dirs and not (p / META_NAME).is_file():
        raise FileNotFoundError(f"checkpoint.resume: no complete DeepSpeed checkpoint directory at {p} "
                                f"(a ckpt-* folder from a deepspeed run's checkpoints/)")
    if not dirs and not p.is_file():
        raise FileNotFoundError(f"checkpoint.resume: no checkpoint file at {p}")
    return p, _load(p, dirs)


def latest_of_earlier_runs(cfg, run_dir, dirs: bool = False) -> tuple[Path, dict] | None:
    """A relaunch gets a new run directory: `resume: latest` then continues the newest earlier
    run of the same name next to it (runs/<time>-<name>/checkpoints)."""
    import yaml

    here = Path(run_dir).resolve()
    candidates = []
    for other in map(RunDir, here.parent.iterdir() if here.parent.is_dir() else []):
        if other.path == here or not other.checkpoint_dir.is_dir():
            continue
        try:
            name = (yaml.safe_load(other.config_path.read_text()) or {}).get("name")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if name != cfg.name:
            continue
        for _, p in listing(other.checkpoint_dir, dirs):
            candidates.append((p.stat().st_mtime, p))
    for _, p in sorted(candidates, reverse=True):
        try:
            return p, _load(p, dirs)
        except Exception:
            continue
    return None
