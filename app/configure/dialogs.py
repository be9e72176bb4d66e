"""Preset dialogs: load (shipped + user, with descriptions; delete user ones), save as."""
from __future__ import annotations

from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from ..widgets.dialogs import ConfirmDialog


class SavePresetDialog(ModalScreen["tuple[str, str] | None"]):
    """Ask for a user preset's name and description; returns (name, description), or None when
    cancelled. The description follows the name (`describe(name)`: under a new name it says what
    the preset came from and what changed) until the user edits it: a copy saved as "mine" must
    not keep quickstart's words without anyone deciding so."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, suggested: str, describe=None):
        super().__init__(classes="dialog-screen")
        self.suggested = suggested
        self.describe = describe or (lambda name: "")
        self._offered = self.describe(suggested)  # the description this dialog wrote last

    def compose(self):
        with Vertical(classes="dialog"):
            yield Label("Save the form as a user preset named:")
            yield Input(self.suggested, id="preset-name", placeholder="letters, digits, . _ -")
            yield Static("", id="name-error", classes="field-msg -error")
            yield Label("Description (shown in the preset list):")
            yield Input(self._offered, id="preset-description", placeholder="what this preset is for")
            yield Static("enter: save   tab: next field   escape: cancel", classes="field-hint")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "preset-name":
            return
        desc = self.query_one("#preset-description", Input)
        if desc.value == self._offered:  # not edited by hand: follow the name
            self._offered = self.describe(event.value.strip())
            desc.value = self._offered

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """A bad name is said here, and the dialog stays open to fix it."""
        from ...engine.config import ConfigError
        from ...engine.presets import check_name

        name = self.query_one("#preset-name", Input).value.strip()
        try:
            check_name(name)
        except ConfigError as exc:
            self.query_one("#name-error", Static).update(exc.problems[0][1])
            self.query_one("#preset-name", Input).focus()
            return
        self.dismiss((name, self.query_one("#preset-description", Input).value.strip()))

    def action_cancel(self) -> None:
        self.dismiss(None)


class SectionsDialog(ModalScreen["str | None"]):
    """Go to a form section: its digit, or the arrows and enter. Returns the section, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")] + [
        Binding(str(i), f"pick({i})", show=False) for i in range(1, 10)]

    def __init__(self, sections: list[tuple[str, bool, int]], here: str | None = None):
        super().__init__(classes="dialog-screen")
        self.sections = sections  # (section, has something to show, problems in it)
        self.here = here  # the section the focus is in: highlighted first

    def compose(self):
        with Vertical(classes="dialog", id="sections-dialog"):
            yield Label("Go to section: its number, or ↑↓ and enter")
            yield OptionList(id="section-list")

    def on_mount(self) -> None:
        ol = self.query_one("#section-list", OptionList)
        for i, (group, shown, bad) in enumerate(self.sections, 1):
            note = "  (nothing for this strategy)" if not shown else (
                f"  ✗ {bad} problem{'s' if bad > 1 else ''}" if bad else "")
            ol.add_option(Option(f"{i}  {group}{note}", id=group, disabled=not shown))
        ol.highlighted = next((i for i, s in enumerate(self.sections) if s[0] == self.here), 0)
        ol.focus()

    def action_pick(self, number: int) -> None:
        if number <= len(self.sections) and self.sections[number - 1][1]:
            self.dismiss(self.sections[number - 1][0])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class LoadPresetDialog(ModalScreen["object | None"]):
    """Pick a preset; returns its PresetInfo, or None. Delete removes a user preset (after asking)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"),
                Binding("delete,ctrl+d", "delete", "Delete user preset")]

    def __init__(self, on_deleted=None):
        super().__init__()
        self.on_deleted = on_deleted  # called with the path of a preset this dialog deleted

    def compose(self):
        with Vertical(classes="dialog dialog-wide", id="load-dialog"):
            yield Label("enter: load   delete: remove a user preset   escape: cancel")
            yield OptionList(id="preset-list")

    def on_mount(self) -> None:
        self.refresh_list()

    def on_resize(self) -> None:
        """Fit the list inside the dialog at any terminal height: a list taller than the dialog is
        cut off, and its cursor can move below the bottom edge (the list scrolls only itself)."""
        box = self.query_one("#load-dialog")
        room = box.styles.max_height.resolve(self.size, self.size) - box.styles.gutter.height
        others = sum(w.outer_size.height for w in box.children if w.id != "preset-list")
        self.query_one("#preset-list").styles.max_height = max(3, min(20, int(room) - others))

    def refresh_list(self) -> None:
        from ...engine.presets import list_presets

        self.presets = list_presets()
        ol = self.query_one("#preset-list", OptionList)
        ol.clear_options()
        ol.add_options([Option(Content.from_markup("[b]$name[/b]  [dim]$source · $strategy[/dim]\n  $desc",
                                                   name=p.name, source=p.source, strategy=p.strategy,
                                                   desc=p.description or "(no description)"), id=str(i))
                        for i, p in enumerate(self.presets)])
        if self.presets:
            ol.highlighted = 0
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.presets[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        ol = self.query_one("#preset-list", OptionList)
        if ol.highlighted is None:
            return
        info = self.presets[ol.highlighted]
        if info.source != "user":
            self.notify(f"{info.name} is a shipped preset; only user presets can be deleted", severity="warning")
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            from ...engine.config import ConfigError
            from ...engine.presets import delete_user_preset

            try:
                delete_user_preset(info.name)
            except ConfigError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"deleted user preset {info.name}")
            if self.on_deleted is not None:
                self.on_deleted(info.path)
            self.refresh_list()

        self.app.push_screen(ConfirmDialog(f"Delete user preset {info.name!r} ({info.path})?"), done)
