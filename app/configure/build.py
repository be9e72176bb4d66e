"""How the Configure form is built: the first frame gets only the first section's title (and
FIRST_FRAME_FIELDS of its fields), the rest of that section, the GPU pickers, then all other
sections, titles included, are mounted a refresh apart after it. Mixed into ConfigForm."""
from __future__ import annotations

from textual.containers import Grid, Horizontal
from textual.widgets import Input, Label, Static

from .controls import FieldMessage, FormInput, FormSelect, FormSwitch, group_id, slug
from .fields import CUSTOM, FIELDS, GROUPS, Field, format_value, get_path

# Fields of the first section built with the first frame. None: the first frame is the screen's
# frame (title, section heading, summary, key bar) and the whole first section follows one refresh
# later, before the other sections. `python -m bench.first_frame_parts --reps 9` (80x24, against a
# Textual hello world): with 3 fields first, first frame 1.55x and the section complete at 1.97x;
# with none, 1.23x and 1.86x (the first field itself comes later: 1.56x -> 1.85x).
FIRST_FRAME_FIELDS = 0

_INPUT_TYPE = {"int": "integer", "float": "number"}


class FormBuilding:
    """Widgets for each field and section, mounted a part at a time so the first frame comes early."""

    def compose(self):
        self._last_strategy = self.data.get("strategy")
        first = [f for f in FIELDS if f.group == GROUPS[0]]
        self._later = first[FIRST_FRAME_FIELDS:]  # a Select is six widgets: the rest come right after
        yield from self._group_widgets(GROUPS[0], first[:FIRST_FRAME_FIELDS])
        self._mounted_paths.update(f.path for f in first[:FIRST_FRAME_FIELDS])
        self.mounted_groups.add(GROUPS[0])

    def on_mount(self) -> None:
        self.call_after_refresh(self._mount_next)

    async def _mount_next(self) -> None:
        if self._quitting():
            return  # quit within the first half second: nothing more to build
        if self._later:
            later, self._later = self._later, []
            widgets = [w for f in later for w in self._field_widgets(f)]
            await self._w[group_id(GROUPS[0])].mount_all(widgets)
            self._mounted_paths.update(f.path for f in later)
            self.slurm_again()
            if self.screen.is_current and self.screen.focused is None:
                self.screen.focus_next()  # the first field, as auto-focus would have chosen at mount
            self._edited()
            self.call_after_refresh(self._mount_next)
            return
        if not self._cuda_ready:
            await self._mount_cuda()
            self.call_after_refresh(self._mount_next)
            return
        rest = [g for g in GROUPS if g not in self.mounted_groups]
        if rest:
            await self._mount_groups(rest)
            self.call_after_refresh(self._mount_next)
        elif self.quit_when_complete:
            self.app.exit()

    def _quitting(self) -> bool:
        """The app is shutting down (exit() was called, or this form is being removed): a quit in
        the first half second must not fail on the half-built form."""
        return self.app.return_code is not None or not self.is_attached or not self.app.is_running

    @property
    def complete(self) -> bool:
        """Every group mounted (tests and snapshots wait for this)."""
        return len(self.mounted_groups) == len(GROUPS) and self._cuda_ready and not self._later

    def _group_widgets(self, group: str, fields: list | None = None) -> list:
        """Title and grid of one group (or of its first fields), fields shown or hidden as the
        values say before mounting."""
        if fields is None:
            fields = [f for f in FIELDS if f.group == group]
        title = Static(group, classes="group-title", id=group_id(group) + "-title")
        grid = Grid(*[w for f in fields for w in self._field_widgets(f)], classes="group", id=group_id(group))
        self._w[title.id], self._w[grid.id] = title, grid
        shown_any = False
        for f in fields:
            shown = f.path in self.problems or f.shown(self.value_of)  # unmounted: the loaded values
            shown_any = shown_any or shown
            for w in self._parts(f):
                w.display = shown
        title.display = grid.display = shown_any
        return [title, grid]

    async def _mount_groups(self, groups: list) -> None:
        """The sections after the first, in one mount: one per refresh laid the whole screen out
        again after each (9 layouts of a growing form, ~20 % of a start's CPU)."""
        await self.mount_all([w for g in groups for w in self._group_widgets(g)])  # in order: appending keeps it
        # Only now are their fields read from their widgets and marked: a revalidation during the
        # mount (the GPU probe's answer) read blank Selects and mounted messages into a grid
        # that had no parent yet (MountError at start-up).
        self._mounted_paths.update(f.path for f in FIELDS if f.group in groups)
        self.mounted_groups.update(groups)
        self.slurm_again()
        self._edited()  # the screen re-applies problems and visibility to the new fields

    def _field_widgets(self, f: Field) -> list:
        value = get_path(self.data, f.path)
        label = Label(f.label, id="lbl-" + slug(f.path), classes="field-label")
        out = [label]
        if f.kind == "choice":
            opts = [(self.choice_label(c), c) for c in f.choices]
            value = value if f.schema else self.value_of(f.path)
            sel = FormSelect(opts, allow_blank=False, value=value if value in f.choices else CUSTOM,
                         id=f.wid, compact=True)
            if CUSTOM in f.choices:
                custom = Input("" if value in f.choices else str(value), placeholder="package.module:callable",
                               id=f.wid + "-custom", compact=True)
                out.append(Horizontal(sel, custom, id="ctl-" + slug(f.path), classes="field-ctl"))
            else:
                out.append(sel)
        elif f.kind == "bool":
            out.append(FormSwitch(bool(value), id=f.wid))
        elif f.kind == "partition":  # its choices come from sinfo, asked later (form.set_partitions)
            value = value or ""
            out.append(FormSelect(self.partition_options(value), allow_blank=False, value=value, id=f.wid,
                                  compact=True))
        elif f.kind == "devices":
            cpu = self.data.get("accelerator") == "cpu"
            procs = FormInput(format_value("int", value) if cpu else "1", type="integer", id="f-devices-procs",
                          compact=True)
            row, below = ([], []) if cpu else self._cuda_widgets(format_value("devices", value))
            self._cuda_ready = not cpu
            out.append(Horizontal(procs, *row, id="ctl-devices", classes="field-ctl"))
            out.extend(below)
            out.append(FieldMessage("", id="gpu-note", classes="field-msg span2", markup=False))
        else:
            out.append(FormInput(format_value(f.kind, value), type=_INPUT_TYPE.get(f.kind, "text"),
                             id=f.wid, compact=True))
        if f.hint or f.path == "train.batch_size":
            # markup=False: a reason may hold brackets ("pip install 'torchdeck[deepspeed]'", [0, 1])
            out.append(FieldMessage(f.hint, id="msg-" + slug(f.path), classes="field-msg span2", markup=False))
        for w in out:  # ids looked up often: a query walks the whole DOM, a dict does not
            for x in (w, *w._pending_children):
                self._w[x.id] = x
        return out
