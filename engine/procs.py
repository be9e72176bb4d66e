"""Whether a process is alive, without psutil (imports nothing of torchdeck)."""
from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """A process with this id exists on this host (another user's counts: it exists). No id, or
    one no process can have, is not alive."""
    if not pid or pid < 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):  # ProcessLookupError: gone
        return False
    return True


def module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """`python -m module args` without the working directory first on sys.path: a user's
    torchdeck.py, yaml.py or psutil.py in the folder they start from would be imported in place
    of ours. Python 3.11+ has -P for it; 3.10 gets the same from a -c line that drops sys.path[0]."""
    import sys

    py = python or sys.executable
    if sys.version_info >= (3, 11):
        return [py, "-P", "-m", module, *args]
    boot = (f"import runpy, sys; del sys.path[0]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [py, "-c", boot, *args]
