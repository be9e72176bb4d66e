"""The form's own controls (a Select safe at shutdown, an Input that says why it refused a key, a
Switch that says on/off in words, a message row measured by its real width) and the ids it gives
fields and sections."""
from __future__ import annotations

from textual.geometry import Size
from textual.message import Message
from textual.reactive import Reactive
from textual.widgets import Input, Select, Static, Switch


def slug(path: str) -> str:
    """A field's path as a widget id part: train.lr -> train-lr."""
    return path.replace(".", "-")


def group_id(group: str) -> str:
    return "grp-" + group.split()[0].lower()


def show(widget: Static, content) -> None:
    """Static.update lays the whole screen out again (~200 widgets here), and the form is
    re-checked on every key: the same words are not drawn again, and new words that take the
    rows the widget has now (the command line, the summary) are drawn in place."""
    if widget.content == content:
        return
    rows, width = widget.content_size.height, widget.content_size.width
    widget.update(content, layout=False)
    auto_width = widget.styles.width is not None and widget.styles.width.is_auto
    if auto_width or not width or widget.visual.get_height(widget.styles, width) != rows:
        widget.refresh(layout=True)  # another size: the screen is laid out again


class FormSelect(Select):
    """A Select that skips its mount-time setup once the app is shutting down: the form mounts its
    groups after the first paint, and a Select whose Mount arrives mid-shutdown (its inner label
    already gone) made Textual fail the exit with NoMatches '#label'."""

    def on_mount(self, event) -> None:
        if not self.app.is_running:
            event.prevent_default()  # Select's own mount handler would query the removed label


class FormInput(Input):
    """An Input that says why it refused a key: a number field drops letters (Textual's `type`
    restriction plays the terminal bell, which many terminals mute), and the form shows a note
    on the field until its next edit."""

    class Refused(Message):
        def __init__(self, input: "FormInput") -> None:
            super().__init__()
            self.input = input

    # Textual's Input sets its scrollable width to the text's on every key, and that width asks for
    # a layout of the whole screen. A field's box is the form's (1 row, the grid's width), never
    # the text's, and the cursor scrolls by the width itself: no layout needed for it.
    virtual_size = Reactive(Size(0, 0), layout=False)

    def restricted(self) -> None:
        super().restricted()
        self.post_message(self.Refused(self))


class FormSwitch(Switch):
    """A Switch that says "on" or "off" in words beside its slider: over SSH the colours that tell
    one from the other are often lost. (No widget and no import more: it draws both itself.)"""

    WORD_WIDTH = 4  # " off"

    def render(self):
        return _SliderWord(super().render(), " on" if self.value else " off", self.WORD_WIDTH)

    def get_content_width(self, container, viewport) -> int:
        return super().get_content_width(container, viewport) + self.WORD_WIDTH


class _SliderWord:
    """Switch's slider (4 cells) then a word, on one line."""

    def __init__(self, slider, word: str, width: int):
        self.slider, self.word, self.width = slider, word, width

    def __rich_console__(self, console, options):
        from rich.segment import Segment  # loaded with Textual already; imported here, not at the first frame

        slider_width = max(1, options.max_width - self.width)
        line = console.render_lines(self.slider, options.update(width=slider_width, height=1), pad=False)[0]
        yield from line
        yield Segment(self.word.ljust(self.width))
        yield Segment.line()


class FieldMessage(Static):
    """A field's hint or problem, spanning both grid columns. Textual sizes an auto grid row by
    one column's width even for a widget spanning two, so a hint over ~29 characters at 80
    columns got a second, empty row: measure it by the width it really has."""

    def get_content_height(self, container, viewport, width: int) -> int:
        return super().get_content_height(container, viewport, max(width, container.width - self.styles.gutter.width))
