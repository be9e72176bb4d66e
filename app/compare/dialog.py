"""Compare strategies, from Configure: which strategies (checkboxes), how long, and a target
(`val_acc>=0.9`, `val_loss<=1.6`, or an accuracy as a number: `torchdeck compare --target`'s text);
the form's job is then run under each, one after another (engine.runs.compare.launch)."""
from __future__ import annotations

from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from ...engine.errors import UsageError
from ...engine.runs.compare import ALL_STRATEGIES
from ...engine.runs.metric import parse_target
from ...engine.strategies import get_strategy


class Tick(Checkbox):
    """A checkbox that says its state in text, not by colour alone (colours are often lost over
    SSH): a tick when on, blank when off."""

    @property
    def _button(self):
        self.BUTTON_INNER = "✓" if self.value else " "
        return super()._button


class CompareDialog(ModalScreen["dict | None"]):
    """Returns {"strategies": [...], "steps": int, "target": metric.Target | None}, or None when cancelled."""

    # One line per checkbox, no border (a focused one is highlighted instead), in columns as wide
    # as their names: 'model-parallel' whole in a 64-column dialog at 80 columns.
    DEFAULT_CSS = """
    CompareDialog #cmp-pick { grid-size: 4; grid-columns: auto; grid-gutter: 0 2; height: auto;
                              margin: 1 0; }
    CompareDialog #cmp-pick Tick { border: none; padding: 0; height: 1; width: auto; }
    CompareDialog #cmp-pick Tick:focus { border: none; background: $boost; }
    CompareDialog .cmp-line { height: auto; }
    CompareDialog .cmp-line Label { padding: 1 1 0 0; }
    CompareDialog .cmp-line Input { width: 14; }
    CompareDialog .cmp-line #cmp-target { width: 1fr; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, job_name: str):
        super().__init__(classes="dialog-screen")
        self.job_name = job_name

    def compose(self):
        with Vertical(classes="dialog"):
            yield Label(f"Run {self.job_name} under each strategy, one after another:")
            with Grid(id="cmp-pick"):
                for s in ALL_STRATEGIES:
                    yield Tick(s, get_strategy(s).compared_by_default, id=f"cmp-{s}")
            with Horizontal(classes="cmp-line"):
                yield Label("steps each")
                yield Input("50", id="cmp-steps", type="integer")
                yield Label("target")
                yield Input("", id="cmp-target", placeholder="e.g. 0.6, val_loss<=1.6")
            yield Static("", id="cmp-error", classes="field-msg -error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Compare", variant="primary", id="go")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#go", Button).focus()

    def choice(self) -> dict | str:
        """What was picked, or why it cannot start (said in the dialog, which stays open)."""
        picked = [s for s in ALL_STRATEGIES if self.query_one(f"#cmp-{s}", Checkbox).value]
        if not picked:
            return "pick at least one strategy"
        try:
            steps = int(self.query_one("#cmp-steps", Input).value or "0")
        except ValueError:
            steps = 0
        if steps < 2:
            return "steps each: a whole number, at least 2 (the first logged steps are warm-up)"
        text = self.query_one("#cmp-target", Input).value.strip()
        target = None
        if text:
            try:  # the text `torchdeck compare --target` takes; a bare number is an accuracy (0.6, 60%)
                target = parse_target(text)
            except UsageError as exc:
                return f"target: {exc}"
        return {"strategies": picked, "steps": steps, "target": target}

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "go":
            self.dismiss(None)
            return
        got = self.choice()
        if isinstance(got, str):
            self.query_one("#cmp-error", Static).update(got)
            return
        self.dismiss(got)

    def action_cancel(self) -> None:
        self.dismiss(None)
