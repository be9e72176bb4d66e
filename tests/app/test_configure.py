"""Pilot tests of the Configure screen: typing into the form, validation, presets, launch."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from torchdeck.app.configure.fields import FIELDS, GROUPS, flatten
from torchdeck.app.configure.form import group_id
from torchdeck.app.main import TorchdeckApp
from torchdeck.engine import config as cfgmod
from torchdeck.engine.presets import resolve
from torchdeck.engine.strategies import world_size
from textual.widgets import Input, Select, SelectionList

ROOT = Path(__file__).resolve().parents[2]
SIZE = (120, 40)


def gpu(i, used, pids):
    from torchdeck.app.sources.nvml import GPUSample

    return GPUSample(index=i, name="NVIDIA A100-SXM4-40GB", util=0.0, mem_used_mb=used, mem_total_mb=40960,
                     temp_c=40, power_w=60.0, power_limit_w=300.0, pids=pids)


def two_fake_gpus():
    """Two GPUs, the second busy (this machine has none: the only fake is the hardware)."""
    from torchdeck.app.sources.nvml import FakeGPUSource

    return FakeGPUSource([gpu(0, 512, []), gpu(1, 20480, [4242])])


def no_gpus():
    from torchdeck.app.sources.nvml import FakeGPUSource

    return FakeGPUSource([], reason="no NVIDIA driver library (libnvidia-ml) on this host")


class RecordingApp(TorchdeckApp):
    """The app, keeping every notification it shows (Textual has no public list of them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.messages: list[str] = []

    def notify(self, message, **kwargs) -> None:
        self.messages.append(str(message))
        super().notify(message, **kwargs)

    def said(self, text: str) -> bool:
        return any(text in m for m in self.messages)


@pytest.fixture
def presets_dir(tmp_path, monkeypatch):
    d = tmp_path / "presets"
    monkeypatch.setenv("TORCHDECK_PRESETS", str(d))
    return d


async def ready(pilot):
    """Wait until the GPU probe is back and the form has settled."""
    screen = pilot.app.screen
    for _ in range(600):
        if getattr(screen, "gpus_loaded", False) and screen.form.complete:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.1)
    return screen


async def type_into(pilot, wid: str, text: str) -> None:
    """Focus an Input and type `text` over what it holds, key by key, as a user would: its text
    selected (End, Shift+Home) and typed over, or emptied with Ctrl+U when `text` is empty. A
    backspace a character re-checked the form for each (9 for 127.0.0.1); emptying it first
    checked it empty too, an error shown (and the screen laid out) only to be taken back."""
    w = pilot.app.screen.query_one("#" + wid, Input)
    w.focus()
    await pilot.pause()
    await pilot.press("end", "shift+home" if text else "ctrl+u")
    await pilot.press(*[("full_stop" if c == "." else c) for c in text])
    await pilot.pause(0.1)


async def choose(pilot, wid: str, typed: str) -> None:
    """Open a Select with enter, type to search, enter to pick."""
    w = pilot.app.screen.query_one("#" + wid, Select)
    w.focus()
    await pilot.press("enter")
    await pilot.pause(0.05)
    await pilot.press(*typed, "enter")
    await pilot.pause(0.1)


def invalid(screen, path: str) -> str | None:
    """The reason shown under a field marked invalid, else None."""
    if not screen.form.is_invalid(path):
        return None
    shown = screen.form.message(path)
    assert shown == screen.problems[path]
    return shown


def make_app(tmp_path, gpus=None, preset=None):
    return RecordingApp(preset=preset, gpu_source=gpus or no_gpus(), runs_root=tmp_path / "runs")


# ----------------------------------------------------------------------------- the form


async def test_form_shows_the_default_preset_and_every_setting(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        expected = cfgmod.load(resolve("quickstart")).to_dict()
        assert screen.form.to_dict() == expected
        assert screen.preset_name == "quickstart" and not screen.modified
        leaves = set(flatten(expected)) - {"schema_version"}
        assert leaves == {f.path for f in FIELDS if f.schema}  # where is the form's own (this host or SLURM)
        assert str(screen.query_one("#summary").render()).startswith("2 processes · world 2 · global batch 128")
        assert str(screen.query_one("#command").render()) == "$ torchdeck run quickstart"


async def test_bad_value_is_marked_and_launch_refused_until_fixed(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-batch_size", "0")
        assert "at least 1" in invalid(screen, "train.batch_size")
        assert "modified" in str(screen.query_one("#preset-bar").render())
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: train.batch_size")
        assert not (tmp_path / "runs").exists()
        await type_into(pilot, "f-train-batch_size", "32")
        assert invalid(screen, "train.batch_size") is None and screen.cfg is not None
        assert "global batch 64" in str(screen.query_one("#summary").render())
        assert "--set train.batch_size=32" in str(screen.query_one("#command").render())


async def test_impossible_combinations_are_marked_with_the_reason(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-devices-procs", "1")
        assert "one process" in invalid(screen, "devices")
        await type_into(pilot, "f-devices-procs", "2")
        assert screen.cfg is not None
        await choose(pilot, "f-backend", "n")
        assert screen.query_one("#f-backend", Select).value == "nccl"
        assert "nccl needs CUDA" in invalid(screen, "backend")
        await pilot.press("ctrl+r")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: backend")
        await choose(pilot, "f-backend", "g")
        assert screen.cfg is not None and invalid(screen, "backend") is None


async def test_mpi_backend_is_marked_where_torch_has_none(tmp_path, presets_dir):
    """The form asks the same detector as `torchdeck validate` (torch's libraries, not torch)."""
    import torch.distributed as dist

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-backend", "m")
        assert screen.query_one("#f-backend", Select).value == "mpi"
        if dist.is_mpi_available():
            assert screen.cfg is not None and invalid(screen, "backend") is None
            return
        assert "no MPI support" in invalid(screen, "backend") and screen.cfg is None
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: backend") and not (tmp_path / "runs").exists()


async def test_a_master_addr_no_host_can_have_is_marked_on_its_field(tmp_path, presets_dir, monkeypatch):
    """`a;touch${IFS}/tmp/x` used to pass and surface only at rendezvous on another node."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-nodes-master_addr", "node")
        await pilot.press("semicolon", "t", "o", "u", "c", "h", "dollar_sign")
        await pilot.pause(0.1)
        assert screen.query_one("#f-nodes-master_addr", Input).value == "node;touch$"
        assert "characters a host name cannot have" in invalid(screen, "nodes.master_addr")
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: nodes.master_addr") and not (tmp_path / "runs").exists()
        await type_into(pilot, "f-nodes-master_addr", "gpu01.cluster.local")
        assert invalid(screen, "nodes.master_addr") is None and screen.cfg is not None
        # A key lays the screen out (~200 widgets) at most once: for the command line under the
        # form, which each key changes. The Input's own text width asked for one more, in a frame
        # of its own (2 a key before).
        layouts = []
        real = type(screen)._refresh_layout
        monkeypatch.setattr(type(screen), "_refresh_layout", lambda self, *a, **k: layouts.append(1) or real(self, *a, **k))
        await pilot.press("full_stop", *"xyz")
        await pilot.pause(0.2)
        assert screen.query_one("#f-nodes-master_addr", Input).value == "gpu01.cluster.local.xyz"
        assert len(layouts) <= 4, len(layouts)


async def test_the_summary_says_whether_the_data_is_decoded_once_within_the_budget(tmp_path, presets_dir, monkeypatch):
    """Issue 17: the Configure summary states the cache decision and the node's budget."""
    from PIL import Image

    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / "imgs" / c / f"{i}.png")
    monkeypatch.chdir(tmp_path)  # a short path to type: each key re-checks the form
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert not screen.form.is_shown("data.cache")  # synthetic: generated in memory
        assert "generated in memory" in str(screen.query_one("#summary").render())
        await choose(pilot, "f-data-dataset", "i")
        await type_into(pilot, "f-data-root", "imgs")  # relative to the working directory
        assert screen.form.is_shown("data.cache") and screen.form.is_shown("data.cache_budget_mb")
        text = str(screen.query_one("#summary").render())
        assert "6 images decoded once into RAM" in text and "one copy for the node's 2 ranks" in text
        await choose(pilot, "f-data-cache", "n")
        assert "decoded every epoch" in str(screen.query_one("#summary").render())


async def test_f8_estimates_memory_per_rank_in_a_child_process_until_the_form_changes(tmp_path, presets_dir):
    """Issue 19: the summary shows what `torchdeck validate --memory` prints for the form, measured
    in a child process (the app never imports torch); an edit makes it stale, so it goes."""
    from screen_helpers import until

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-batch_size", "96")
        await pilot.press("f8")
        summary_text = lambda: str(screen.query_one("#summary").render())  # noqa: E731
        assert "memory: estimating" in summary_text()
        assert await until(pilot, lambda: "memory per rank (MiB, estimated;" in summary_text(), timeout=90), \
            summary_text() + "\n".join(app.messages)
        assert "batch 96)" in summary_text() and "activations" in summary_text()
        assert app.said("memory per rank (MiB, estimated;")
        await type_into(pilot, "f-train-batch_size", "64")
        assert "memory per rank" not in summary_text()


async def test_fields_follow_the_strategy(tmp_path, presets_dir):
    app = make_app(tmp_path, gpus=two_fake_gpus())
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        shown = screen.form.is_shown
        assert shown("backend") and shown("nodes.num_nodes") and shown("nodes.ifname")
        assert not shown("nodes.node_rank")  # one node is node 0
        await type_into(pilot, "f-nodes-num_nodes", "2")
        assert shown("nodes.node_rank") and world_size(screen.cfg) == 4
        await type_into(pilot, "f-nodes-node_rank", "1")
        assert str(screen.query_one("#summary").render()).startswith(
            "2 processes x 2 nodes (this is node 1: ranks 2-3) · world 4 · global batch 256")
        await type_into(pilot, "f-nodes-node_rank", "2")
        assert "must be in 0..1" in invalid(screen, "nodes.node_rank")
        await type_into(pilot, "f-nodes-node_rank", "1")
        await type_into(pilot, "f-nodes-num_nodes", "1")
        assert "must be in 0..0" in invalid(screen, "nodes.node_rank")  # shown while it is wrong
        await type_into(pilot, "f-nodes-node_rank", "0")
        assert not shown("nodes.node_rank") and screen.cfg is not None
        assert screen.form.message("nodes.num_nodes") == ""  # the error went with the fix
        await choose(pilot, "f-strategy", "dp")
        assert screen.query_one("#f-accelerator", Select).value == "cuda"
        assert not shown("backend") and not shown("nodes.num_nodes")
        gpus = screen.query_one("#f-devices-gpus", SelectionList)
        assert gpus.display and gpus.option_count == 2
        assert "busy" in str(gpus.get_option_at_index(1).prompt)
        assert "total across GPUs" in screen.form.message("train.batch_size")
        gpus.focus()
        await pilot.press("space", "down", "space")
        await pilot.pause(0.2)
        assert screen.cfg is not None and screen.cfg.devices == [0, 1]
        assert "r0:cuda:0,cuda:1" in str(screen.query_one("#summary").render())
        await choose(pilot, "f-strategy", "gp")
        assert screen.query_one("#f-devices-gpu", Select).display and not gpus.display
        await choose(pilot, "f-strategy", "fs")
        assert shown("fsdp.state_dict") and shown("backend")
        # the preset's gloo (ddp on CPU) cannot serve fsdp on GPUs: reset, and said (issue 27)
        assert app.said("strategy fsdp: backend gloo -> auto (fsdp on GPUs needs nccl)")
        assert screen.query_one("#f-backend", Select).value == "auto" and invalid(screen, "backend") is None
        await choose(pilot, "f-backend", "g")
        assert "fsdp on GPUs needs nccl" in invalid(screen, "backend")  # chosen by hand: marked, kept
        await choose(pilot, "f-backend", "nc")
        assert invalid(screen, "backend") is None
        assert screen.cfg is not None and world_size(screen.cfg) == 2


# ----------------------------------------------------------------------------- presets


async def test_save_load_overwrite_delete_round_trip(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "1")
        await type_into(pilot, "f-optimizer-lr", "0.02")
        await choose(pilot, "f-scheduler-name", "co")
        want = cfgmod.from_dict(screen.form.to_dict())
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        name_in = app.screen.query_one("#preset-name", Input)
        assert name_in.value == "my-quickstart"
        await pilot.press("end", *["backspace"] * len(name_in.value), *"quickstart", "enter")
        await pilot.pause(0.2)
        assert "shipped preset" in str(app.screen.query_one("#name-error").render())  # the dialog stays
        await pilot.press("end", *["backspace"] * len(name_in.value), *"mine")
        await pilot.pause(0.1)
        # issue 27: the copy said quickstart's description; it now says where it came from
        said = "mine: from quickstart, with epochs 1, lr 0.02 and scheduler cosine"
        assert app.screen.query_one("#preset-description", Input).value == said
        await pilot.press("enter")
        await pilot.pause(0.3)
        saved = presets_dir / "mine.yaml"
        assert saved.is_file()
        want.name, want.description = "mine", said
        assert cfgmod.load(saved).to_dict() == want.to_dict()
        assert screen.preset_name == "mine" and screen.preset_source == "user" and not screen.modified

        # change something, save under the same name: asked first, then overwritten
        await type_into(pilot, "f-train-epochs", "2")
        assert screen.modified
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert app.screen.query_one("#preset-name", Input).value == "mine"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert "Overwrite" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await pilot.pause(0.3)
        assert cfgmod.load(saved).train.epochs == 2

        # load the shipped default, then the user preset back: identical to what was saved
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        await pilot.press("enter")  # the default is listed first
        await pilot.pause(0.3)
        assert screen.preset_name == "quickstart" and screen.form.to_dict()["train"]["epochs"] == 3
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        dialog = app.screen
        idx = next(i for i, p in enumerate(dialog.presets) if p.name == "mine")
        assert "user" in str(dialog.query_one("#preset-list").get_option_at_index(idx).prompt)
        await pilot.press(*["down"] * idx, "enter")
        await pilot.pause(0.3)
        assert screen.form.to_dict() == cfgmod.load(saved).to_dict()
        assert not screen.modified

        # delete: shipped presets refuse, the user one goes after a yes
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        await pilot.press("delete")
        await pilot.pause(0.2)
        assert app.said("shipped preset")
        await pilot.press(*["down"] * idx, "delete")
        await pilot.pause(0.2)
        await pilot.press("y")
        await pilot.pause(0.3)
        assert not saved.exists()
        assert "mine" not in [p.name for p in app.screen.presets]


async def test_headless_command_reproduces_the_form(tmp_path, presets_dir):
    """The command line shown is exactly what `torchdeck run` needs to build the same config."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "1")
        await type_into(pilot, "f-name", "my run")
        await type_into(pilot, "f-optimizer-betas", "0.8, 0.99")
        await choose(pilot, "f-model-name", "ml")
        cmd = str(screen.query_one("#command").render())[2:]
        import shlex

        argv = shlex.split(cmd)
        assert argv[:3] == ["torchdeck", "run", "quickstart"]
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        data = yaml.safe_load(resolve("quickstart").read_text())
        got = cfgmod.from_dict(cfgmod.apply_overrides(data, sets))
        assert got.to_dict() == screen.cfg.to_dict()
        assert len(sets) == 4


def test_app_imports_no_torch():
    """The first frame must not wait for torch: importing and starting the app never imports it."""
    code = (
        "import sys, asyncio\n"
        "from torchdeck.app.main import TorchdeckApp\n"
        "async def main():\n"
        "    app = TorchdeckApp()\n"
        "    async with app.run_test() as pilot:\n"
        "        for _ in range(200):  # the whole form: leaving mid-mount races Select's own mount\n"
        "            if getattr(app.screen, 'gpus_loaded', False) and app.screen.form.complete:\n"
        "                break\n"
        "            await pilot.pause(0.05)\n"
        "        assert type(app.screen).__name__ == 'ConfigureScreen' and app.screen.form.complete\n"
        "asyncio.run(main())\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'torchdeck.engine.worker', 'torchdeck.engine.supervisor')))\n"
        "print('BAD', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BAD []" in out.stdout


def test_gc_is_paused_only_until_the_first_frame(tmp_path, presets_dir):
    """Start-up runs without cyclic GC passes (they only cost time there); after the first frame,
    and whatever happens, the GC runs again."""
    import gc

    app = make_app(tmp_path)
    seen = {}
    shown = app.first_frame_shown

    def spy() -> None:
        if seen:  # the 2 s fallback timer may call again while the app quits (slow under load)
            return
        seen["before"] = gc.isenabled()
        shown()
        seen["after"] = gc.isenabled()
        app.call_later(app.action_quit)

    app.first_frame_shown = spy
    assert gc.isenabled()
    app.run(headless=True, size=SIZE)
    assert seen == {"before": False, "after": True}
    assert gc.isenabled() and app.return_code == 0


# ----------------------------------------------------------------------------- launch


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_launch_quickstart_runs_to_finished(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "1")
        await type_into(pilot, "f-data-train_size", "1024")
        await type_into(pilot, "f-data-val_size", "256")
        await pilot.press("f5")
        await pilot.pause(0.5)
        assert app.last_run is not None and app.last_run.parent == tmp_path / "runs"
        launched = cfgmod.load(app.last_run / "config.yaml")
        assert launched.train.epochs == 1 and launched.data.train_size == 1024
        from torchdeck.app.monitor.screen import MonitorScreen
        from torchdeck.engine.rundir.layout import RunDir

        monitor = app.screen
        assert isinstance(monitor, MonitorScreen) and monitor.run_dir.path == app.last_run
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not monitor.run_state.final:
            await pilot.pause(0.5)
        state = monitor.run_state
        assert state.status == "finished", f"monitor says {state.status}; run status {RunDir(app.last_run).status()}"
        ranks = state.rank_list()
        assert [r.rank for r in ranks] == [0, 1]
        assert state.total_steps and all(r.step == state.total_steps for r in ranks)  # every rank reached the end
        await pilot.pause(0.5)
        shot = app.export_screenshot()
        assert "FINISHED" in shot and f"{state.total_steps}/{state.total_steps}" in shot
        assert RunDir(app.last_run).status() == "finished"


async def test_command_palette_offers_the_main_actions(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for want in ("Launch", "Save preset", "Load preset", "Go to section", "Export torchrun / sbatch",
                     "Runs list", "Quit"):
            assert want in titles
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"Load preset")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert type(app.screen).__name__ == "LoadPresetDialog"
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "ConfigureScreen"


async def test_quit_while_the_form_is_still_mounting_exits_cleanly(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+q")  # before the later groups are mounted
        for _ in range(100):
            if app.return_code is not None or not app.is_running:
                break
            await pilot.pause(0.05)
    assert app.return_code == 0


async def test_a_revalidation_while_a_section_mounts_reads_the_loaded_values(tmp_path, presets_dir, monkeypatch):
    """CI once crashed at start-up with MountError: the GPU probe's answer revalidated the form
    while a section was being mounted, read its not yet mounted Selects as blank (problems) and
    tried to mount their messages into a grid with no parent. Here every section mount is
    interrupted by a revalidation, as that answer did."""
    from torchdeck.app.configure.form import ConfigForm

    real = ConfigForm.mount_all

    interrupted = []

    async def mount_all(self, widgets, *args, **kwargs):
        widgets = list(widgets)
        result = real(self, widgets, *args, **kwargs)
        # later sections' titles and grids (the first one comes with the screen's compose)
        grids = [w.id for w in widgets if w.has_class("group") and w.id != "grp-essentials"]
        if grids:
            interrupted.extend(grids)
            self.screen.revalidate()  # their widgets are created, not mounted yet
        return await result

    monkeypatch.setattr(ConfigForm, "mount_all", mount_all)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert screen.form.complete and len(interrupted) >= 5, interrupted
        assert screen.problems == {}, screen.problems
        assert screen.cfg is not None and screen.cfg.strategy == "ddp"


async def test_a_start_checks_the_form_a_few_times_not_once_per_section(tmp_path, presets_dir, monkeypatch):
    """The sections after the first come in one mount: mounted one per refresh, each was followed by
    a check of the whole form and a layout of the whole screen (13 checks a start, not 5)."""
    from torchdeck.app.configure.screen import ConfigureScreen

    checks = []
    real = ConfigureScreen.revalidate
    monkeypatch.setattr(ConfigureScreen, "revalidate", lambda self: checks.append(1) or real(self))
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        assert screen.form.complete and screen.cfg is not None
        assert len(checks) <= 8, len(checks)


async def test_loading_over_unsaved_changes_asks_first(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "7")
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert "Discard the changes" in str(app.screen.query_one("#question").render())
        await pilot.press("n")
        await pilot.pause(0.2)
        assert screen.form.value_of("train.epochs") == 7 and screen.modified
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await pilot.pause(0.2)
        await pilot.press("y")
        await pilot.pause(0.3)
        assert screen.form.value_of("train.epochs") == 3 and not screen.modified


# ----------------------------------------------------------------------------- export


def cli(*args: str, cwd: Path) -> str:
    """`torchdeck ARGS` as a user runs it (same presets dir: the fixture sets it in the env)."""
    out = subprocess.run([sys.executable, "-m", "torchdeck.cli", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=180, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    return out.stdout


def shown(dialog, wid: str) -> str:
    return str(dialog.query_one("#" + wid).render())


async def test_export_shows_what_torchdeck_export_prints_and_writes_it(tmp_path, presets_dir, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f6")
        await pilot.pause(0.3)
        dialog = app.screen
        assert type(dialog).__name__ == "ExportDialog"
        assert shown(dialog, "export-cli") == "same as: torchdeck export quickstart --torchrun"
        torchrun = cli("export", "quickstart", "--torchrun", cwd=work)
        sbatch = cli("export", "quickstart", "--sbatch", cwd=work)
        assert shown(dialog, "export-torchrun") + "\n" == torchrun
        assert shown(dialog, "export-sbatch") + "\n" == sbatch
        assert str(resolve("quickstart").resolve()) in torchrun  # an unmodified preset is read as is

        await pilot.press("w")
        await pilot.pause(0.3)
        assert sorted(p.name for p in work.iterdir()) == ["quickstart.sbatch", "quickstart.torchrun.sh"]
        assert (work / "quickstart.torchrun.sh").read_text() == torchrun
        assert (work / "quickstart.sbatch").read_text() == sbatch
        assert app.said(f"wrote quickstart.torchrun.sh, quickstart.sbatch in {work}")
        check = subprocess.run(["bash", "-n", str(work / "quickstart.sbatch")], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr

        (work / "quickstart.sbatch").write_text("old")
        await pilot.press("w")  # files exist: asked first
        await pilot.pause(0.3)
        assert "Overwrite quickstart.torchrun.sh, quickstart.sbatch" in shown(app.screen, "question")
        await pilot.press("y")
        await pilot.pause(0.3)
        assert (work / "quickstart.sbatch").read_text() == sbatch
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "ConfigureScreen"


async def test_export_of_deepspeed_adds_its_launcher(tmp_path, presets_dir, monkeypatch):
    """Strategy deepspeed: the dialog also shows what `torchdeck export --deepspeed` prints (the
    hostfile and a `deepspeed` line per node) and writes it as <name>.deepspeed.sh."""
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app(tmp_path, preset=str(resolve("deepspeed")))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f6")
        await pilot.pause(0.3)
        dialog = app.screen
        launcher = cli("export", "deepspeed", "--deepspeed", cwd=work)
        assert shown(dialog, "export-deepspeed") + "\n" == launcher
        assert "cat > deepspeed.hostfile <<'EOF'" in launcher and "--module torchdeck.engine.worker" in launcher
        await pilot.press("w")
        await pilot.pause(0.3)
        assert sorted(p.name for p in work.iterdir()) == ["deepspeed.deepspeed.sh", "deepspeed.sbatch",
                                                          "deepspeed.torchrun.sh"]
        assert (work / "deepspeed.deepspeed.sh").read_text() == launcher


async def test_export_of_an_edited_multi_node_form_writes_its_config(tmp_path, presets_dir, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-nodes-num_nodes", "2")
        await type_into(pilot, "f-nodes-master_addr", "10.1.2.3")
        await type_into(pilot, "f-nodes-ifname", "tdnone0")
        assert screen.cfg is not None and world_size(screen.cfg) == 4
        # an interface this host lacks: Launch here would fail, but the export is for other nodes
        assert "no network interface tdnone0" in invalid(screen, "nodes.ifname")
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: nodes.ifname") and not (tmp_path / "runs").exists()
        await pilot.press("f6")
        await pilot.pause(0.3)
        dialog = app.screen
        text = shown(dialog, "export-torchrun")
        for k in (0, 1):
            assert f"--node-rank {k} --master-addr 10.1.2.3 --master-port 29500" in text
        assert "GLOO_SOCKET_IFNAME=tdnone0 torchrun --nnodes 2 --nproc-per-node 2" in text
        config = work / "quickstart.yaml"
        assert str(config) in text  # the edited form, not the shipped preset, is what torchrun reads
        await pilot.press("w")
        await pilot.pause(0.3)
        assert sorted(p.name for p in work.iterdir()) == ["quickstart.sbatch", "quickstart.torchrun.sh",
                                                          "quickstart.yaml"]
        assert cfgmod.load(config).to_dict() == screen.cfg.to_dict()
        assert "--nodes=2" in (work / "quickstart.sbatch").read_text()
        # the command the dialog says is equivalent prints the same text
        argv = shlex.split(shown(dialog, "export-cli").removeprefix("same as: "))
        assert argv[:2] == ["torchdeck", "export"] and "--write-config" in argv
        assert cli(*argv[1:], cwd=work) == text + "\n"


async def test_export_of_an_invalid_form_is_refused_with_the_reason(tmp_path, presets_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-nodes-num_nodes", "2")
        await type_into(pilot, "f-nodes-master_port", "0")
        assert "fixed master_port" in invalid(screen, "nodes.master_port")
        await pilot.press("f6")
        await pilot.pause(0.3)
        assert app.said("Cannot export: nodes.master_port: multi-node runs need a fixed master_port")
        assert app.screen is screen and app.focused.id == "f-nodes-master_port"
        assert not any(tmp_path.glob("*.sbatch"))


# ----------------------------------------------------------------------------- 80x24


async def test_preset_list_scrolls_to_its_cursor_at_every_size(tmp_path, presets_dir):
    """Issue 14 bug 2: at 80x24 the list was taller than the dialog, so End highlighted a preset
    below the dialog's bottom edge and Enter loaded it blind."""
    from screen_helpers import inside, screen_text

    presets_dir.mkdir()
    for name in ("alpha", "beta", "zeta"):
        (presets_dir / f"{name}.yaml").write_text(f"name: {name}\ndescription: user preset {name}\n")
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        # one app, the terminal resized between sizes (a start of the form each cost as much as
        # the rest of the test); the dialog is opened at each size, as it is after a resize
        for size in [(80, 24), (80, 16), (140, 45), (100, 12)]:
            await pilot.resize_terminal(*size)
            await pilot.pause(0.2)
            await pilot.press("ctrl+o")
            await pilot.pause(0.2)
            dialog = app.screen
            assert dialog.size == size, (dialog.size, size)
            ol = dialog.query_one("#preset-list")
            box = dialog.query_one("#load-dialog")
            for key, name in [("end", "zeta"), ("home", "quickstart"), ("end", "zeta")]:
                await pilot.press(key)
                await pilot.pause(0.2)
                assert dialog.presets[ol.highlighted].name == name
                assert inside(box.region, dialog.region), f"{size}: the dialog is cut by the screen"
                assert inside(ol.region, box.content_region), f"{size}: the list is cut by the dialog"
                text = screen_text(app)
                assert f"{name}  " in text, f"{size}: {name} highlighted but not shown:\n{text}"
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert screen.preset_name == "zeta" and app.screen is screen


async def test_footer_keeps_no_residue_with_a_dropdown_open_at_80_columns(tmp_path, presets_dir):
    """Issue 14 bug 8: with a Select open the footer's keys overflow 80 columns, and the last
    column showed a letter of the keys scrolled under the palette key (`^p paletteu`)."""
    from screen_helpers import screen_text

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        for wid in ("f-strategy", "f-optimizer-name"):
            screen.query_one("#" + wid, Select).focus()
            await pilot.pause(0.1)
            await pilot.press("enter")
            await pilot.pause(0.3)
            footer = screen_text(app).splitlines()[-1]
            assert "Dismiss menu" in footer, footer  # the dropdown is open: its key is in the footer
            assert footer.rstrip().endswith("▏^p palette"), repr(footer)
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert screen_text(app).splitlines()[-1].rstrip().endswith("▏^p palette")


async def test_deleting_the_loaded_preset_unties_the_form_from_it(tmp_path, presets_dir, monkeypatch):
    """Issue 14 bug 6: after deleting the loaded user preset the header and the command line still
    named it, and Export wrote a torchrun script reading the deleted file, and no YAML."""
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    presets_dir.mkdir()
    (presets_dir / "other.yaml").write_text("name: other\nstrategy: cpu\n")
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "1")
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        name_in = app.screen.query_one("#preset-name", Input)
        await pilot.press("end", *["backspace"] * len(name_in.value), *"mine", "enter")
        await pilot.pause(0.3)
        assert screen.preset_name == "mine" and (presets_dir / "mine.yaml").is_file()
        want = screen.form.to_dict()

        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        dialog = app.screen
        for name in ("other", "mine"):  # deleting another preset changes nothing here
            idx = next(i for i, p in enumerate(dialog.presets) if p.name == name)
            dialog.query_one("#preset-list").highlighted = idx
            await pilot.press("delete")
            await pilot.pause(0.2)
            await pilot.press("y")
            await pilot.pause(0.3)
            if name == "other":
                assert screen.preset_name == "mine"
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert not (presets_dir / "mine.yaml").exists()
        bar = str(screen.query_one("#preset-bar").render())
        command = str(screen.query_one("#command").render())
        assert "preset mine" not in bar and "deleted" in bar, bar
        assert command.startswith("$ torchdeck run PRESET.yaml --set"), command  # no file named
        argv = shlex.split(command[2:])
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]  # over an empty preset
        assert cfgmod.from_dict(cfgmod.apply_overrides({}, sets)).to_dict() == cfgmod.from_dict(want).to_dict()
        assert screen.form.to_dict() == want  # the form keeps what it showed

        await pilot.press("f6")
        await pilot.pause(0.3)
        exp = app.screen
        config = work / "mine.yaml"
        assert f"-m torchdeck.engine.worker {config}" in shown(exp, "export-torchrun")
        await pilot.press("w")
        await pilot.pause(0.3)
        assert config.is_file() and (work / "mine.torchrun.sh").is_file()
        assert cfgmod.load(config).to_dict() == cfgmod.from_dict(want).to_dict()


async def test_export_writes_the_form_when_its_preset_file_went_away(tmp_path, presets_dir, monkeypatch):
    """A preset removed behind the app's back (another shell) cannot be what torchrun reads."""
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    presets_dir.mkdir()
    (presets_dir / "ext.yaml").write_text("name: ext\nstrategy: cpu\n")
    app = make_app(tmp_path, preset="ext")
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert screen.preset_name == "ext" and not screen.modified
        (presets_dir / "ext.yaml").unlink()
        await pilot.press("f6")
        await pilot.pause(0.3)
        assert f"-m torchdeck.engine.worker {work / 'ext.yaml'}" in shown(app.screen, "export-torchrun")
        await pilot.press("w")
        await pilot.pause(0.3)
        assert cfgmod.load(work / "ext.yaml").to_dict() == screen.cfg.to_dict()


async def test_several_nodes_at_loopback_are_warned_on_the_field(tmp_path, presets_dir):
    """Issue 14 rough edge 9: two nodes meeting at 127.0.0.1 passed the form silently. It is valid
    (a rehearsal on one host), so Launch stays possible, but the field and the summary say it."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert not screen.query_one("#warnings").display
        await type_into(pilot, "f-nodes-num_nodes", "2")
        assert screen.cfg is not None and not screen.problems  # valid: nothing refused
        assert invalid(screen, "nodes.master_addr") is None
        msg = screen.form.message("nodes.master_addr")
        assert "127.0.0.1 is this host itself" in msg
        assert screen.query_one("#msg-nodes-master_addr").has_class("-warning")
        box = screen.query_one("#warnings")
        assert box.display and "nodes.master_addr: 127.0.0.1 is this host itself" in str(box.render())
        await type_into(pilot, "f-nodes-master_addr", "10.1.2.3")
        assert screen.form.message("nodes.master_addr") == "" and not box.display


async def test_devices_hint_says_what_the_count_means_for_the_strategy(tmp_path, presets_dir):
    """Issue 14 rough edge 11: model-parallel runs one process, yet the devices hint said
    "number of CPU processes"; there the count is the number of pipeline stages."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert screen.form.message("devices") == "number of CPU processes (ranks)"
        await choose(pilot, "f-strategy", "mo")
        assert screen.query_one("#f-strategy", Select).value == "model-parallel"
        hint = screen.form.message("devices")
        assert "one process" in hint and "stages" in hint and "CPU processes" not in hint, hint
        await choose(pilot, "f-strategy", "cp")
        await type_into(pilot, "f-devices-procs", "1")
        assert screen.form.message("devices") == "one process on the CPU"


async def test_an_emptied_field_is_said_in_words(tmp_path, presets_dir):
    """Issue 14 rough edge 11: an emptied number field said `must be an integer, got '' (str)`."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-epochs", "")
        await type_into(pilot, "f-optimizer-lr", "")
        assert invalid(screen, "train.epochs") == "must be an integer; it is empty"
        assert invalid(screen, "optimizer.lr") == "must be a number; it is empty"


# ----------------------------------------------------------------------------- strategy deepspeed


async def test_deepspeed_fields_follow_the_strategy_and_the_stage(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        shown = screen.form.is_shown
        assert not shown("deepspeed.stage") and not shown("deepspeed.config")  # quickstart is ddp
        await choose(pilot, "f-strategy", "dee")
        assert screen.cfg.strategy == "deepspeed" and screen.cfg.deepspeed.stage == 2
        for path in ("deepspeed.stage", "deepspeed.offload_optimizer", "deepspeed.overlap_comm",
                     "deepspeed.contiguous_gradients", "deepspeed.config", "backend", "nodes.num_nodes"):
            assert shown(path), path
        assert not shown("deepspeed.offload_param")  # parameters offload under stage 3 only
        assert not shown("ddp.bucket_cap_mb")
        await type_into(pilot, "f-deepspeed-stage", "3")
        assert shown("deepspeed.offload_param")
        await choose(pilot, "f-deepspeed-offload_param", "c")
        assert screen.cfg.deepspeed.offload_param == "cpu" and not screen.problems
        await type_into(pilot, "f-deepspeed-stage", "2")
        assert "needs ZeRO stage 3" in invalid(screen, "deepspeed.offload_param")  # wrong, so still shown
        assert shown("deepspeed.offload_param")


async def test_a_bad_ds_config_is_marked_on_its_field(tmp_path, presets_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)  # short relative paths: each key re-checks the form (full paths took 50 s)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "dee")
        await type_into(pilot, "f-deepspeed-config", "nope.json")
        assert "no such file" in invalid(screen, "deepspeed.config")
        (tmp_path / "ds.json").write_text('{"train_batch_size": 31}')  # 2 ranks cannot split it
        await type_into(pilot, "f-deepspeed-config", "ds.json")
        assert "train_batch_size 31 must equal" in invalid(screen, "deepspeed.config")
        (tmp_path / "ok.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
        await type_into(pilot, "f-deepspeed-config", "ok.json")
        assert invalid(screen, "deepspeed.config") is None


async def test_without_deepspeed_the_strategy_field_says_how_to_install_it(tmp_path, presets_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # how Python marks a module it cannot import
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "dee")
        assert invalid(screen, "strategy") == "deepspeed: not installed: pip install 'torchdeck[deepspeed]'"
        # the brackets are shown as typed (not read as markup), under the field and in the summary
        assert "pip install 'torchdeck[deepspeed]'" in str(screen.query_one("#summary").render())


# ----------------------------------------------------------------------------- sections (issue 14 rough edge 4)

ESSENTIALS = ["strategy", "accelerator", "devices", "model.name", "data.dataset", "train.batch_size",
              "optimizer.lr", "train.epochs", "train.precision"]


async def test_essentials_come_first_and_fit_the_first_screen_at_80x24(tmp_path, presets_dir):
    """~60 settings in one column: what most runs change is the first section, on the first screen."""
    from screen_helpers import screen_text

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        assert [f.path for f in FIELDS if f.group == "Essentials"] == ESSENTIALS
        assert FIELDS[0].group == "Essentials" and app.focused.id == "f-strategy"
        text = screen_text(app)
        lines = text.splitlines()
        assert lines[1].strip() == "Essentials", text
        for label in ("strategy", "devices", "model", "dataset", "batch size", "lr", "epochs", "precision"):
            assert any(ln.startswith(f" {label} ") for ln in lines), f"{label} not on the first screen:\n{text}"


async def test_keys_jump_between_sections_at_80x24(tmp_path, presets_dir):
    """Ctrl+Down/Up go to the next/previous section; Ctrl+G lists them, a digit jumps. Sections the
    strategy hides are skipped; the section's title comes into view with its first field focused."""
    from screen_helpers import inside, screen_text

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        walk = []
        for _ in range(9):
            await pilot.press("ctrl+down")
            await pilot.pause(0.2)
            group = BY_PATH_GROUP(app.focused)
            walk.append(group)
            lines = [ln.strip().split("  ")[0] for ln in screen_text(app).splitlines()]  # scrollbar off
            assert group in lines, f"{group}'s title not shown"
            assert inside(app.focused.region, screen.form.region), f"{group}: focused field not in view"
        # quickstart is ddp: every section has something to show, and the walk wraps around
        assert walk == ["Where", "Run", "Distributed", "Model & data", "Optimization", "Precision & speed",
                        "Checkpoints", "Strategy options", "Essentials"]  # SLURM options: only for SLURM
        await pilot.press("ctrl+up")
        await pilot.pause(0.2)
        assert BY_PATH_GROUP(app.focused) == "Strategy options"

        await pilot.press("ctrl+g")
        await pilot.pause(0.3)
        listing = screen_text(app)
        assert "6  Optimization" in listing, listing
        await pilot.press("6")
        await pilot.pause(0.3)
        assert app.focused.id == "f-optimizer-name"

        await choose(pilot, "f-strategy", "cp")  # cpu: no distributed settings, no strategy options
        await type_into(pilot, "f-devices-procs", "1")
        assert screen.cfg is not None
        app.query_one("#f-data-train_size").focus()  # Model & data
        await pilot.press("ctrl+down")
        await pilot.pause(0.2)
        assert BY_PATH_GROUP(app.focused) == "Optimization"
        app.query_one("#f-checkpoint-dir").focus()
        await pilot.press("ctrl+down")
        await pilot.pause(0.2)
        assert BY_PATH_GROUP(app.focused) == "Essentials"  # Strategy options skipped
        await pilot.press("ctrl+g")
        await pilot.pause(0.3)
        assert "nothing for this strategy" in screen_text(app)
        await pilot.press("9")  # a hidden section: the list stays, says so
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "SectionsDialog"
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.screen is screen

        await choose(pilot, "f-strategy", "dee")  # deepspeed's settings are its strategy options
        await pilot.press("ctrl+g")
        await pilot.pause(0.3)
        await pilot.press("9")
        await pilot.pause(0.3)
        assert app.focused.id == "f-deepspeed-stage"


def test_every_label_fits_its_column():
    """The label column is 24 wide (main.tcss): a longer label wraps and its second line is cut
    ('loader workers (-1:' with an empty row under it)."""
    too_long = [f.label for f in FIELDS if len(f.label) > 23]
    assert not too_long, too_long


def BY_PATH_GROUP(widget) -> str:
    """The form section a focused control belongs to."""
    for node in widget.ancestors_with_self:
        if node.has_class("group"):
            return next(g for g in GROUPS if group_id(g) == node.id)
    raise AssertionError(f"{widget} is in no section")


async def test_wide_terminals_get_a_side_summary_and_section_list(tmp_path, presets_dir):
    """At 140 columns the form keeps its width and a side panel lists the sections (with their
    problems) and the run as it will start; at 80 columns the one-line summary stays below."""
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        side = screen.query_one("#side")
        assert side.display and not screen.query_one("#summary").display
        text = str(screen.query_one("#side-summary").render())
        for want in ("Run\n", "2 processes", "world size 2", "global batch 128", "rank 0: cpu", "rank 1: cpu",
                     "data: synthetic"):
            assert want in text, text
        assert "[b]" not in text  # the panel's text is plain; only its title is bold
        await type_into(pilot, "f-train-batch_size", "0")
        sections = str(screen.query_one("#sections").render())
        assert "1 Essentials" in sections and "1 problem" in sections, sections
        assert "invalid" in str(screen.query_one("#side-summary").render())
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        assert not side.display and screen.query_one("#summary").display


async def test_a_hint_that_fits_takes_one_row_at_80_columns(tmp_path, presets_dir):
    """Textual sizes an auto grid row by one column's width even for a message spanning two: the
    31-character devices hint got a second, empty row at 80 columns (3 rows lost in Essentials)."""
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        note, model = screen.query_one("#gpu-note"), screen.query_one("#lbl-model-name")
        assert len(str(note.render())) > 29
        assert model.region.y == note.region.y + 1, (note.region, model.region)
        # a message longer than the row still wraps, by the width it has
        msg = screen.query_one("#msg-train-batch_size")
        msg.update("x " * 40)
        await pilot.pause(0.2)
        assert msg.region.height == 2 and screen.query_one("#lbl-optimizer-lr").region.y == msg.region.y + 2


async def test_pick_free_gpus_takes_the_least_used_idle_ones_or_says_who_is_busy(tmp_path, presets_dir):
    """The palette's "Pick free GPUs" follows devices: free:N (issue 19): as many as are picked now."""
    from torchdeck.app.sources.nvml import FakeGPUSource

    board = FakeGPUSource([gpu(0, 9000, []), gpu(1, 20480, [4242]), gpu(2, 300, [])])
    app = make_app(tmp_path, gpus=board)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "dp")
        gpus = screen.query_one("#f-devices-gpus", SelectionList)
        gpus.focus()
        await pilot.press("space", "down", "space")  # GPUs 0 and 1 (1 is busy)
        await pilot.pause(0.2)
        assert screen.cfg.devices == [0, 1]
        screen.action_pick_free_gpus()
        await pilot.pause(0.3)
        assert sorted(gpus.selected) == [0, 2] and screen.cfg.devices == [0, 2]
        assert app.said("devices free:2: GPU 0, 2 (no other process, least memory used: GPU 2 300 MiB, GPU 0 9000 MiB)")
        gpus.select_all()
        await pilot.pause(0.2)
        assert sorted(gpus.selected) == [0, 1, 2]
        screen.action_pick_free_gpus()
        await pilot.pause(0.2)
        assert app.said("free:3: only 2 of 3 GPU(s) free (no other process on them): GPU 2, 0; in use: GPU 1")
        assert sorted(gpus.selected) == [0, 1, 2]  # refused: the choice stays as it was


def test_quitting_at_the_first_frame_exits_cleanly(tmp_path, presets_dir):
    """A user who quits the moment the screen appears (the form still mounting its sections
    behind the first frame) gets a clean exit, not NoMatches from a half-built Select."""

    class QuitAtOnce(TorchdeckApp):
        def first_frame_shown(self) -> None:
            super().first_frame_shown()
            self.exit()

    app = QuitAtOnce(gpu_source=no_gpus(), runs_root=tmp_path / "runs")
    app.run(headless=True, size=(80, 24))
    assert app.return_code == 0


async def test_key_bar_draws_the_keys_on_one_line_and_a_click_presses_one(tmp_path, presets_dir):
    """The key bar is one widget (Textual's Footer is one per key: a tenth of the first frame): the
    same line as the compact footer, and a click on a key runs it (disabled keys would ring)."""
    from torchdeck.app.configure.dialogs import LoadPresetDialog
    from torchdeck.app.keybar import KeyBar

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        bar = app.screen.query_one(KeyBar)
        line = str(bar.render())
        assert line.startswith("f5 Launch ^o Load ^s Save ^g Sections f2 Runs f6 Export ^q Quit"), line
        assert len(line) == 80 and line.rstrip().endswith("▏^p palette"), repr(line)
        await pilot.click(KeyBar, offset=(line.index("Load"), 0))
        await pilot.pause(0.3)
        assert isinstance(app.screen, LoadPresetDialog)


# ----------------------------------------------------------------------------- issue 27


def summary_text(screen) -> str:
    return str(screen.query_one("#summary").render())


async def test_every_problem_is_marked_and_counted_at_once(tmp_path, presets_dir):
    """Issue 27 item 5: batch size 0, then an emptied lr: the batch error vanished and the summary
    said `1 problem: optimizer.lr` until lr was fixed. A batch size of 0 also hid strategy cpu's
    own rule on devices 2 (the strategy's rules ran only once every field was fine)."""
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-batch_size", "0")
        await type_into(pilot, "f-optimizer-lr", "")
        assert invalid(screen, "train.batch_size") == "must be at least 1, got 0"
        assert invalid(screen, "optimizer.lr") == "must be a number; it is empty"
        text = summary_text(screen)
        assert text.startswith("2 problems: train.batch_size: must be at least 1, got 0"), text
        assert "also optimizer.lr" in text, text
        await type_into(pilot, "f-optimizer-lr", "0.1")
        assert invalid(screen, "optimizer.lr") is None
        assert summary_text(screen) == "1 problem: train.batch_size: must be at least 1, got 0"
        await choose(pilot, "f-strategy", "cp")
        await type_into(pilot, "f-devices-procs", "2")
        assert set(screen.problems) == {"devices", "train.batch_size"}, screen.problems
        assert "strategy cpu runs one process" in invalid(screen, "devices")
        text = summary_text(screen)
        assert text.startswith("2 problems: devices: strategy cpu runs one process") and \
            text.endswith("also train.batch_size"), text
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert app.said("Cannot launch: devices") and not (tmp_path / "runs").exists()


def test_the_problem_count_names_each_problem_or_how_many_more():
    from torchdeck.app.configure.summary import problems_line

    two = problems_line({"devices": "strategy cpu runs one process", "accelerator": "cuda needs a GPU"})
    assert two == "2 problems: devices: strategy cpu runs one process\nalso accelerator"
    many = problems_line({f"f{i}": "bad" for i in range(7)})
    assert many == "7 problems: f0: bad\nalso f1, f2, f3 and 3 more"
    assert problems_line({"": "cannot load this preset"}) == "1 problem: preset: cannot load this preset"


async def test_a_new_strategy_keeps_what_fits_resets_what_cannot_and_says_so(tmp_path, presets_dir):
    """Issue 27: strategy cpu kept devices 2 (then an error), gpu -> ddp kept accelerator cuda on a
    host with no GPU, and dp said "pick at least one GPU" where it needs two."""
    app = make_app(tmp_path)  # no GPU on this host
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "cp")
        assert screen.form.value_of("devices") == 1 and screen.cfg is not None, screen.problems
        assert app.said("strategy cpu: devices 2 -> 1 (cpu runs one process)")
        await choose(pilot, "f-strategy", "dd")
        assert screen.form.value_of("devices") == 2 and screen.cfg is not None, screen.problems
        assert app.said("strategy ddp: devices 1 -> 2 (ddp needs 2 or more processes)")
        await choose(pilot, "f-strategy", "dp")
        assert screen.form.value_of("accelerator") == "cuda"
        assert app.said("strategy dp: accelerator cpu -> cuda (dp runs on GPUs)")
        assert "2 or more GPUs" in invalid(screen, "devices")
        await choose(pilot, "f-strategy", "gp")
        await choose(pilot, "f-strategy", "dd")
        assert screen.form.value_of("accelerator") == "cpu" and screen.form.value_of("devices") == 2
        assert app.said("strategy ddp: accelerator cuda -> cpu (this host has no GPU)")
        assert screen.cfg is not None, screen.problems


async def test_a_gpu_choice_carries_over_between_gpu_and_dp(tmp_path, presets_dir):
    """The GPU picked for strategy gpu carries into dp's list (dp then asks for a second, in words
    that say two); two picked for dp: gpu keeps one of them and says so, and dp gets both back."""
    app = make_app(tmp_path, gpus=two_fake_gpus())
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "gp")
        assert screen.form.value_of("devices") == []
        screen.query_one("#f-devices-gpu", Select).focus()
        await pilot.press("enter")
        await pilot.pause(0.05)
        await pilot.press("down", "down", "enter")  # past the prompt and GPU 0
        await pilot.pause(0.2)
        assert screen.form.value_of("devices") == [1] and screen.cfg is not None, screen.problems
        await choose(pilot, "f-strategy", "dp")
        assert screen.form.value_of("devices") == [1]  # carried into the list
        assert invalid(screen, "devices") == "dp splits each batch over 2 or more GPUs; with one GPU pick gpu"
        gpus = screen.query_one("#f-devices-gpus", SelectionList)
        gpus.focus()
        await pilot.press("home", "space")
        await pilot.pause(0.2)
        assert screen.cfg is not None and screen.cfg.devices == [0, 1]
        await choose(pilot, "f-strategy", "gp")
        # the one picked before stays the one (it is among the two)
        assert screen.form.value_of("devices") == [1] and screen.cfg is not None, screen.problems
        assert app.said("strategy gpu: devices 0,1 -> 1 (gpu uses one GPU)")
        await choose(pilot, "f-strategy", "dp")
        assert screen.form.value_of("devices") == [0, 1] and screen.cfg is not None  # the list kept both


async def test_saving_under_a_new_name_asks_for_a_description_of_its_own(tmp_path, presets_dir):
    """Issue 27: a preset saved as "mine" kept quickstart's description. The save dialog offers one
    that follows the name until it is edited; what is typed there is what the preset list shows."""
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-train-batch_size", "32")
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        desc = app.screen.query_one("#preset-description", Input)
        assert desc.value == "my-quickstart: from quickstart, with batch size 32"
        await pilot.press("end", "backspace")  # the name: my-quickstart -> my-quickstar
        await pilot.pause(0.1)
        assert desc.value == "my-quickstar: from quickstart, with batch size 32"  # follows the name
        await pilot.press("tab")
        await pilot.press("ctrl+u", *"half batch", "enter")  # typed: kept
        await pilot.pause(0.3)
        saved = cfgmod.load(presets_dir / "my-quickstar.yaml")
        assert saved.description == "half batch" and saved.name == "my-quickstar"
        assert screen.preset_name == "my-quickstar"
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        dialog = app.screen
        idx = next(i for i, p in enumerate(dialog.presets) if p.name == "my-quickstar")
        assert "half batch" in str(dialog.query_one("#preset-list").get_option_at_index(idx).prompt)
        await pilot.press("escape")
        await pilot.pause(0.1)
        await pilot.press("ctrl+s")  # saving over the same user preset keeps its description
        await pilot.pause(0.2)
        assert app.screen.query_one("#preset-description", Input).value == "half batch"


async def test_a_refused_key_is_said_on_its_field(tmp_path, presets_dir):
    """Issue 27: the lr field dropped letters without a word (only `e` got through). Textual's
    number Input refuses them (and rings a bell many terminals mute); the field now says why,
    until the next edit that goes in."""
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        lr = screen.query_one("#f-optimizer-lr", Input)
        lr.focus()
        await pilot.press("end", "x")
        await pilot.pause(0.1)
        assert lr.value == "0.05"
        assert screen.form.message("optimizer.lr") == "lr takes a number such as 0.01 or 1e-3"
        await pilot.press("backspace", "8")
        await pilot.pause(0.2)
        assert lr.value == "0.08" and screen.form.message("optimizer.lr") == ""
        procs = screen.query_one("#f-devices-procs", Input)
        procs.focus()
        await pilot.press("end", "full_stop")
        await pilot.pause(0.1)
        assert procs.value == "2"
        assert screen.form.message("devices") == "devices takes a whole number such as 1"
        await pilot.press("backspace", "2")
        await pilot.pause(0.2)
        assert screen.form.message("devices") == "number of CPU processes (ranks)"


async def test_more_cpu_ranks_than_cores_is_warned_with_the_numbers(tmp_path, presets_dir):
    """Issue 27: `devices 99` on a 2-core host passed without a word (99 ranks x 120 MiB of data).
    The form and `torchdeck validate` warn from one rule (engine.preflight.advice); the global
    batch is written with a thousands separator."""
    from torchdeck.engine.affinity import usable_cpus

    cores, ranks = usable_cpus(), usable_cpus() + 1
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await type_into(pilot, "f-devices-procs", str(cores))
        assert "devices" not in screen.warnings and screen.cfg is not None
        await type_into(pilot, "f-devices-procs", "99" if cores < 99 else str(ranks))
        ranks = screen.form.value_of("devices")
        why = screen.warnings["devices"]
        assert why.startswith(f"{ranks} CPU ranks on {cores} usable core") and "of data" in why, why
        assert screen.form.message("devices") == why and screen.cfg is not None  # a warning: Launch stays
        assert f"warning: devices: {why}" in str(screen.query_one("#warnings").render())
        assert f"global batch {64 * ranks:,}" in summary_text(screen)
    preset = tmp_path / "many.yaml"
    preset.write_text(f"strategy: ddp\ndevices: {ranks}\ntrain: {{batch_size: 64}}\n")
    out = cli("validate", str(preset), cwd=tmp_path)
    assert f"warning: devices: {why}" in out, out


async def test_switches_say_on_or_off_in_words(tmp_path, presets_dir):
    """Issue 27: the form's switches told on from off by colour alone, and over SSH colours are
    often lost. Each says it in text beside its slider, at 80x24, and says the new state when
    toggled from the keyboard."""
    from tests.app.screen_helpers import screen_text

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        sw = screen.query_one("#f-logging-tensorboard")
        start = bool(sw.value)
        sw.focus()
        screen.form.scroll_to_widget(sw, animate=False)
        await pilot.pause(0.2)

        def row() -> str:
            return next((ln for ln in screen_text(app).splitlines() if "tensorboard" in ln), "")

        assert f" {'on' if start else 'off'}" in row(), screen_text(app)
        await pilot.press("space")
        for _ in range(60):
            if f" {'off' if start else 'on'}" in row():
                break
            await pilot.pause(0.05)
        assert sw.value is not start and f" {'off' if start else 'on'}" in row(), screen_text(app)
