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
