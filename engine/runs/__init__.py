"""The run seen from outside, UI-free and torch-free: its layout on disk (`layout`), its status
(`status`), the reducer of its events (`view`), the follower of a live run (`follow`), the
catalog of runs (`catalog`), control (`control`: start, stop, kill, wait) and the words its
numbers are written in (`fmt`). `torchdeck run/attach/runs`, the Monitor and the Runs screen
render this; none of them writes into it.
"""
from .layout import RunDir, list_runs, runs_root
from .status import FINAL, Status

__all__ = ["RunDir", "list_runs", "runs_root", "Status", "FINAL"]
