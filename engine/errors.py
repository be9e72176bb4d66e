"""One base for every error a user should read as a line (or a few), not as a traceback.

The CLI prints `lines` and exits 2; the app shows them in a notification. Anything else that
escapes is a bug and keeps its traceback (`--debug`). No torch here.
"""
from __future__ import annotations


class TorchdeckError(Exception):
    """A problem the user can fix, said in their words: what is wrong and what to do."""

    def __init__(self, *lines: str):
        lines = [str(x) for x in lines if str(x)] or [self.__class__.__doc__ or "error"]
        super().__init__("\n".join(lines))

    @property
    def lines(self) -> list[str]:
        return str(self).splitlines() or [type(self).__name__]


class UsageError(TorchdeckError):
    """A bad argument, preset or run reference on the command line."""


class DataError(TorchdeckError):
    """One clear message naming the data set/root and what to do."""
