"""The user's own code (`module:callable` in model.name and data.dataset): where every command
that builds a user's model or data set looks for it, so `torchdeck run`, `eval`,
`validate --memory`, `tune` and a rank all find the same module, or none of them does.

The rule: a module is looked up on sys.path as Python finds any (an installed package or
PYTHONPATH first), then in the user's folders, searched by a finder placed LAST on
sys.meta_path so that a file of theirs never shadows torchdeck's own modules or an installed
package (appending them to sys.path was not enough: an editable install's finder comes after
sys.path, so a user's torchdeck.py in the folder was imported in place of torchdeck):
  - the folder a run was started from (origin.json's "cwd"), when the command works on a run;
  - the folder of the preset file, when the preset is a file;
  - the current working directory.
No torch here: the supervisor and the preflight use it before any rank starts.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
from pathlib import Path

_folders: list[str] = []  # registered for this process, in the order they are searched


def add_folders(*folders) -> None:
    """Search these folders too (after sys.path), for the rest of this process."""
    for f in folders:
        if f:
            f = str(Path(f).expanduser().resolve())
            if f not in _folders:
                _folders.append(f)


def folders() -> list[str]:
    """The user's folders searched after sys.path, in order."""
    out = list(_folders)
    cwd = os.getcwd()
    return out if cwd in out else out + [cwd]


def run_folders(run_path) -> list[str]:
    """The folders a run's user code was found in when it started: the working directory it was
    launched from and its preset's folder (a preset named by file), from its origin.json."""
    try:
        origin = json.loads((Path(run_path) / "origin.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(origin, dict):
        return []
    out = []
    cwd = origin.get("cwd")
    if isinstance(cwd, str) and cwd:
        out.append(cwd)
    preset = origin.get("preset")
    if isinstance(preset, str) and preset.endswith((".yaml", ".yml")):
        p = Path(preset).expanduser()
        p = p if p.is_absolute() or not cwd else Path(cwd) / p
        out.append(str(p.parent))
    return out


def preset_folder(path) -> str | None:
    """The folder of a preset file (None for a shipped or user preset by name)."""
    return str(Path(path).expanduser().resolve().parent) if path else None


class _UserFolders:
    """The meta path finder for the user's folders: asked only after every other finder."""

    def __init__(self) -> None:
        self.folders: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if path is not None or not self.folders:  # a submodule: its package's __path__ finds it
            return None
        return importlib.machinery.PathFinder.find_spec(name, self.folders)

    def invalidate_caches(self) -> None:
        pass


_finder = _UserFolders()


ENV = "TORCHDECK_USER_FOLDERS"  # the folders, for the processes this one starts (ranks, loader workers)


def extend_path() -> list[str]:
    """Search the user's folders after everything else (once each); returns them. Processes
    started from this one (spawned ranks, a fork server's loader workers unpickling the user's
    data set) get them through the environment: importing this module there installs them."""
    found = folders()
    _install(found)
    os.environ[ENV] = os.pathsep.join(_finder.folders)
    return found


def _install(found) -> None:
    added = [f for f in found if f and f not in _finder.folders]
    if added:
        _finder.folders.extend(added)
        importlib.invalidate_caches()
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)
    elif sys.meta_path[-1] is not _finder:  # something installed after us: stay last
        sys.meta_path.remove(_finder)
        sys.meta_path.append(_finder)


def forget_inherited() -> None:
    """A command the user types starts from its own folders only: the environment it inherits may
    hold another command's (a shell or test harness that ran one before; only the processes a run
    starts are meant to read them)."""
    os.environ.pop(ENV, None)
    _finder.folders.clear()


if os.environ.get(ENV):
    _install(os.environ[ENV].split(os.pathsep))


def load_callable(path: str, kind: str, error: type[Exception]):
    """Import `package.module:callable` by the rule above; `error(message)` when it cannot be,
    naming where it looked."""
    module_name, _, attr = path.partition(":")
    looked = extend_path()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise error(f"{kind} {path!r}: cannot import {module_name}: {type(exc).__name__}: {exc} "
                    f"(looked on sys.path and PYTHONPATH, then in {', '.join(looked)})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise error(f"{kind} {path!r}: {module_name} has no callable named {attr!r}")
    return fn
