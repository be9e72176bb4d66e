"""`torchdeck run`, `launch` and `attach`'s progress display. The lines come from
engine.runs.progress (where the lines rank 0 of an exported torchrun command prints come from too:
one renderer); on a terminal this Display redraws them as a live block with rich's Live, which
prints the log lines and the ranks' own output above the block and leaves nothing stale when the
block changes size (issue 35: the hand-written cursor moves left old lines above Ctrl-C's). rich is
imported only for a TTY: in a pipe the engine's plain Display does everything."""
from __future__ import annotations

import sys

from ..engine import fmt
from ..engine.runs import progress as _plain
from ..engine.runs.progress import (COMPACT_ABOVE, LOG_LEVELS, block, compact, header,  # noqa: F401
                                    log_text, rank_line, script_compact, script_header, script_rank_line,
                                    script_summary, summary)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Display(_plain.Display):
    """On a TTY: a live block that rich's Live redraws in place, with log lines and the ranks' own
    output printed above it. In a pipe: the engine's Display, unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._console = None  # rich's, on a TTY
        self._live = None  # rich.live.Live, from the first frame until finish()/close()

    def _rich(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream, force_terminal=True, highlight=False, soft_wrap=True,
                                    emoji=False, markup=False)
        self._console.width = self.width
        return self._console

    def _print(self, text) -> None:
        """Lines that stay: above the live block while it is up."""
        try:
            self._rich().print(text)
        except (BrokenPipeError, ValueError, OSError):
            pass

    def _tty_message(self, line: str) -> None:
        from rich.text import Text

        self._print(Text(fmt.wrap(line, self.width)))

    def _tty_output(self, lines: list[str]) -> None:
        """On a TTY their colours kept and a progress bar's carriage returns resolved to what a
        terminal would show, the terminal wrapping what is too long."""
        from rich.text import Text

        if any("\x1b" in ln for ln in lines):
            self._print(Text("\n").join(Text.from_ansi(ln) if "\x1b" in ln else Text(ln) for ln in lines))
        else:  # plain lines (most): one Text, a third of the cost of decoding each
            self._print(Text("\n".join(lines)))

    def _start_live(self):
        from rich.live import Live

        console = self._rich()
        redirect = self.stream is sys.stdout  # print() from elsewhere (Ctrl-C's "stopping") goes above the block
        self._live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=redirect,
                          redirect_stderr=redirect and _isatty(sys.stderr))
        self._live.start()
        return self._live

    def _draw(self, lines: list[str]) -> None:
        from rich.text import Text

        live = self._live or self._start_live()
        if self._drawn and self._resized_rows:
            # the terminal rewrapped the old block at its new width: move up over all of its rows
            try:
                w, _ = live._live_render._shape
                live._live_render._shape = (w, self._resized_rows)
            except (AttributeError, TypeError, ValueError):
                pass
        self._resized_rows = 0
        try:
            live.update(Text("\n".join(lines), no_wrap=True, overflow="crop"), refresh=True)
        except (BrokenPipeError, ValueError, OSError):
            pass
        self._drawn = lines

    def close(self) -> None:
        """Leave the block where it is and give the terminal back (its cursor, print())."""
        if self._live is not None:
            live, self._live = self._live, None
            try:
                live.stop()
            except (BrokenPipeError, ValueError, OSError):
                pass
        super().close()
