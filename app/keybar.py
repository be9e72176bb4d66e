"""The key bar: the screen's keys on one line, drawn with the screen's first frame.

Textual's Footer is a widget per key (each styled, data-bound and recomposed after the screen's
bindings settle): at start-up on a 2-core machine that cost about as much as the rest of the
first frame's widgets. This is one widget that renders the same line (key in the footer's key
colours, description in its description colours, the command palette's key at the right end
behind a bar), follows binding changes as Footer does, and maps a click to the key under it.
"""
from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widget import Widget


class KeyBar(Widget):
    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"keybar--key", "keybar--description", "keybar--bar"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        width: 1fr;
        color: $footer-foreground;
        background: $footer-background;
        .keybar--key { color: $footer-key-foreground; background: $footer-key-background; text-style: bold; }
        .keybar--description { color: $footer-description-foreground; background: $footer-description-background; }
        .keybar--bar { color: $foreground 20%; }
        &:hover { pointer: pointer; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._spans: list[tuple[int, int, str, bool]] = []  # x from, x to, key, enabled

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen) -> None:
        if self.is_attached and screen is self.screen:
            self.refresh()

    def _keys(self):
        """(key, key display, description, enabled) per shown action, and the palette's, as Footer lists them."""
        active = self.screen.active_bindings
        seen, keys = set(), []
        palette_key = self.app.COMMAND_PALETTE_BINDING if self.app.ENABLE_COMMAND_PALETTE else None
        for key, (_node, binding, enabled, _tooltip) in active.items():
            if not binding.show or binding.action in seen or key == palette_key:
                continue
            seen.add(binding.action)
            keys.append((binding.key, self.app.get_key_display(binding), binding.description, enabled))
        palette = None
        if palette_key and palette_key in active:
            _node, binding, enabled, _tooltip = active[palette_key]
            palette = (binding.key, self.app.get_key_display(binding), binding.description, enabled)
        return keys, palette

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keybar--key")
        desc_style = self.get_component_rich_style("keybar--description")
        bar_style = self.get_component_rich_style("keybar--bar")
        keys, palette = self._keys()
        width = self.size.width
        right = Text()
        if palette is not None:
            right.append("▏", bar_style)
            right.append(palette[1], key_style)
            right.append(f" {palette[2]} ", desc_style)
        line, spans = Text(), []
        room = width - right.cell_len
        for key, display, description, enabled in keys:
            part = Text()
            part.append(display, key_style)
            part.append(f" {description}", desc_style)
            if not enabled:
                part.stylize("dim")
            if line.cell_len + part.cell_len > room:
                break
            spans.append((line.cell_len, line.cell_len + part.cell_len, key, enabled))
            line.append_text(part)
            line.append(" ")
        if palette is not None:
            line.append(" " * max(0, room - line.cell_len))
            spans.append((line.cell_len, line.cell_len + right.cell_len, palette[0], palette[3]))
            line.append_text(right)
        self._spans = spans
        return line

    def on_click(self, event: events.Click) -> None:
        for start, end, key, enabled in self._spans:
            if start <= event.x < end:
                if enabled:
                    self.app.simulate_key(key)  # one key per active binding (Textual splits "f5,ctrl+r")
                else:
                    self.app.bell()
                return
