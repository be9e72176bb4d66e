"""Export dialog: the torchrun command per node and the SLURM sbatch script for the form (and for
strategy deepspeed, DeepSpeed's launcher: a hostfile and a command per node).

The text comes from engine.export, the same functions `torchdeck export` prints, so what the
dialog shows is what the CLI would print for this config. Imported when the dialog opens, not on
the first frame.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


@dataclass
class Export:
    """What to show and where it would be written."""

    torchrun: str
    sbatch: str
    config_path: Path  # the config torchrun reads on every node
    write_config: bool  # the form differs from any preset file: the config is written with the files
    cli: str  # the `torchdeck export` command that prints the same torchrun text
    folder: Path
    name: str  # file names: <name>.torchrun.sh, <name>.sbatch (and <name>.yaml, <name>.deepspeed.sh)
    deepspeed: str = ""  # strategy deepspeed: DeepSpeed's launcher

    @property
    def files(self) -> dict[Path, str]:
        out = {self.folder / f"{self.name}.torchrun.sh": self.torchrun, self.folder / f"{self.name}.sbatch": self.sbatch}
        if self.deepspeed:
            out[self.folder / f"{self.name}.deepspeed.sh"] = self.deepspeed
        return out


def _safe(name: str) -> str:
    """A file name from a run name: keep letters, digits, '.', '_' and '-'."""
    s = "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip(".-")
    return s or "run"


def build(cfg, data: dict, base: dict, preset_path: Path | None, preset_name: str, modified: bool,
          folder: Path | None = None) -> Export:
    """The export of a valid config. An unmodified preset file is what torchrun reads (as
    `torchdeck export PRESET --torchrun` does); otherwise the form is written as <name>.yaml
    next to the scripts (as `--set ... --write-config FILE` does)."""
    from .summary import overrides
    from ...engine import export
    from ...engine.strategies import get_strategy

    folder = (folder or Path.cwd()).resolve()
    name = _safe(cfg.name)
    # a preset file that went away (deleted from another shell) cannot be what torchrun reads
    write_config = modified or preset_path is None or not Path(preset_path).is_file()
    config_path = folder / f"{name}.yaml" if write_config else Path(preset_path).resolve()
    cli = ["torchdeck", "export", shlex.quote(preset_name or "PRESET.yaml")]
    if write_config:
        for item in overrides(data, base):
            cli += ["--set", shlex.quote(item)]
    cli.append("--torchrun")
    if write_config:
        cli += ["--write-config", shlex.quote(str(config_path))]
    return Export(torchrun=export.torchrun(cfg, str(config_path)), sbatch=export.sbatch(cfg),
                  config_path=config_path, write_config=write_config, cli=" ".join(cli), folder=folder,
                  name=name, deepspeed=export.deepspeed(cfg, str(config_path))
                  if get_strategy(cfg.strategy).own_launcher else "")


def write(exp: Export, cfg) -> list[Path]:
    """Write the scripts (and the config when the form is not a preset file); returns the paths."""
    from ...engine import config as cfgmod
    from ...engine.files import write_atomic

    written = []
    if exp.write_config:
        cfgmod.save(cfg, exp.config_path)
        written.append(exp.config_path)
    for path, text in exp.files.items():
        write_atomic(path, text)
        written.append(path)
    return written


class ExportDialog(ModalScreen[None]):
    """Shows both exports; w writes them to the current directory, c copies the torchrun lines."""

    BINDINGS = [Binding("escape,q", "close", "Close"), Binding("w", "write", "Write files"),
                Binding("c", "copy", "Copy torchrun")]

    def __init__(self, exp: Export, cfg):
        super().__init__(classes="dialog-screen")
        self.exp, self.cfg = exp, cfg

    def compose(self):
        names = ", ".join(p.name for p in self._targets())
        with Vertical(classes="dialog dialog-wide", id="export-dialog"):
            yield Label(f"[b]Export[/b] {self.cfg.name}: torchrun per node, and a SLURM sbatch script")
            with VerticalScroll(id="export-body"):
                yield Static("torchrun, one command per node (run from the project directory):",
                             classes="export-title")
                yield Static(self.exp.torchrun.rstrip("\n"), id="export-torchrun", markup=False,
                             classes="export-text")
                yield Static(f"same as: {self.exp.cli}", id="export-cli", markup=False, classes="field-msg")
                yield Static("SLURM: submit with `sbatch FILE` (the config is embedded):", classes="export-title")
                yield Static(self.exp.sbatch.rstrip("\n"), id="export-sbatch", markup=False, classes="export-text")
                if self.exp.deepspeed:
                    yield Static("DeepSpeed's launcher: the hostfile, then one command per node:", classes="export-title")
                    yield Static(self.exp.deepspeed.rstrip("\n"), id="export-deepspeed", markup=False,
                                 classes="export-text")
            yield Static(f"w: write {names} to {self.exp.folder}", id="export-where", markup=False,
                         classes="field-msg")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Write files (w)", variant="primary", id="write", compact=True)
                yield Button("Copy torchrun (c)", id="copy", compact=True)
                yield Button("Close (esc)", id="close", compact=True)

    def on_mount(self) -> None:
        self.query_one("#export-body").focus()

    def _targets(self) -> list[Path]:
        return ([self.exp.config_path] if self.exp.write_config else []) + list(self.exp.files)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        getattr(self, f"action_{event.button.id}")()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.exp.torchrun)
        self.notify("torchrun commands copied (terminals with OSC 52 clipboard support)")

    def action_write(self) -> None:
        existing = [p for p in self._targets() if p.exists()]
        if not existing:
            self._write()
            return
        from ..widgets.dialogs import ConfirmDialog

        def answer(yes: bool | None) -> None:
            if yes:
                self._write()

        self.app.push_screen(ConfirmDialog(f"Overwrite {', '.join(p.name for p in existing)} in "
                                           f"{self.exp.folder}?"), answer)

    def _write(self) -> None:
        try:
            written = write(self.exp, self.cfg)
        except OSError as exc:
            self.notify(f"Cannot write the export to {self.exp.folder}: {exc.strerror or exc}; "
                        "start torchdeck from a writable directory", severity="error", timeout=10)
            return
        self.notify(f"wrote {', '.join(p.name for p in written)} in {self.exp.folder}", timeout=8)
        self.query_one("#export-where", Static).update(
            f"written: {', '.join(p.name for p in written)} in {self.exp.folder}")
