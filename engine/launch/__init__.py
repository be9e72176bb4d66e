"""The rank side of `torchdeck launch`: the shim each rank runs around the user's script
(shim.py), the rank's event channel to its supervisor (channel.py), and the step events of the
step hook and of `torchdeck.log` (report.py). Stdlib only; importing this package costs nothing.
"""
from __future__ import annotations

import sys

SHIM_MODULE = __name__ + ".shim"  # survives the package's move under torchdeck.


def shim_argv(target: str, args: list[str] = (), module: bool = False, python: str | None = None) -> list[str]:
    """The command line a rank is started with. The working directory must not come first on
    the shim's sys.path (a user's engine.py there would be imported in place of ours): python
    3.11+ has -P for that; 3.10 gets the same from a -c line that drops it."""
    py = python or sys.executable
    tail = [*(["--module"] if module else []), target, *args]
    if sys.version_info >= (3, 11):
        return [py, "-P", "-m", SHIM_MODULE, *tail]
    boot = (f"import sys; del sys.path[0]; from {SHIM_MODULE} import main; "
            f"sys.exit(main(sys.argv[1:], path0_is_ours=False))")
    return [py, "-c", boot, *tail]
