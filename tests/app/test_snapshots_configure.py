"""Snapshots of the Configure screen at fixed sizes, with two fake GPUs instead of NVML.

Regenerate after a deliberate UI change with:
    .venv/bin/python -m pytest tests/app/test_snapshots_configure.py --snapshot-update
"""
from __future__ import annotations

import pytest

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.sources.nvml import FakeGPUSource, GPUSample


def fake_gpus():
    """Two A100s, the second busy: NVML's data fixed, so a picture changes only when the UI does."""
    def s(i, used, pids):
        return GPUSample(index=i, name="NVIDIA A100-SXM4-40GB", util=37.0, mem_used_mb=used,
                         mem_total_mb=40960, temp_c=45, power_w=120.0, power_limit_w=400.0, pids=pids)
    return FakeGPUSource([s(0, 512, []), s(1, 20480, [4242])])


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    return TorchdeckApp(gpu_source=fake_gpus(), runs_root=tmp_path / "runs")


async def settle(pilot):
    screen = pilot.app.screen
    for _ in range(600):
        if screen.gpus_loaded and screen.form.complete:
            break
        await pilot.pause(0.05)
    for inp in screen.query("Input"):
        inp.cursor_blink = False
    await pilot.pause(0.2)


async def pick_dp(pilot):
    await settle(pilot)
    screen = pilot.app.screen
    screen.query_one("#f-strategy").focus()
    await pilot.press("enter")
    await pilot.pause(0.05)
    await pilot.press("d", "p", "enter")
    await pilot.pause(0.1)
    screen.query_one("#f-devices-gpus").focus()
    await pilot.press("space", "down", "space")
    await settle(pilot)
    # the strategy's note (accelerator cpu -> cuda) is a toast that goes after 8 s: not pictured,
    # so a slow machine takes the same picture
    pilot.app.clear_notifications()
    await pilot.pause(0.1)


async def bad_batch(pilot):
    await settle(pilot)
    screen = pilot.app.screen
    screen.query_one("#f-train-batch_size").focus()
    await pilot.press("end", "backspace", "backspace", "0")
    await settle(pilot)


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_configure_default_preset(snap_compare, app, size):
    assert snap_compare(app, terminal_size=size, run_before=settle)


def test_configure_dp_gpu_picker(snap_compare, app):
    assert snap_compare(app, terminal_size=(140, 45), run_before=pick_dp)


def test_configure_invalid_batch_80x24(snap_compare, app):
    assert snap_compare(app, terminal_size=(80, 24), run_before=bad_batch)


async def two_nodes(pilot):
    await settle(pilot)
    screen = pilot.app.screen
    screen.query_one("#f-nodes-num_nodes").focus()
    await pilot.press("end", "backspace", "2")
    await settle(pilot)
    screen.query_one("#f-nodes-node_rank").focus()
    await pilot.press("end", "backspace", "1")
    await settle(pilot)


def test_configure_two_nodes_80x24(snap_compare, app):
    """Multi-node fields: node rank appears with a second node; the summary names this node's ranks."""
    assert snap_compare(app, terminal_size=(80, 24), run_before=two_nodes)


async def preset_list_end(pilot):
    """Ctrl+O with user presets, End: the last one is highlighted, inside the dialog's border."""
    await settle(pilot)
    await pilot.press("ctrl+o")
    await pilot.pause(0.3)
    await pilot.press("end")
    await pilot.pause(0.3)


def test_load_preset_dialog_end_80x24(snap_compare, app, tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    for name in ("alpha", "beta", "zeta"):
        (presets / f"{name}.yaml").write_text(f"name: {name}\ndescription: user preset {name}\n")
    assert snap_compare(app, terminal_size=(80, 24), run_before=preset_list_end)


async def two_problems(pilot):
    """Batch size 0 and an emptied lr (issue 27): both fields marked, the summary counts and names both."""
    await bad_batch(pilot)
    screen = pilot.app.screen
    screen.query_one("#f-optimizer-lr").focus()
    await pilot.press("end", *["backspace"] * 4)
    await settle(pilot)


def test_configure_two_problems_80x24(snap_compare, app):
    assert snap_compare(app, terminal_size=(80, 24), run_before=two_problems)


SCRIPT_DIR = "/tmp/torchdeck-snapshot-project"  # a fixed folder: the side panel names it


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_configure_script_preset(snap_compare, tmp_path, monkeypatch, size):
    """A script preset (issue 35: opening one ended the app): the summary says what each rank
    runs, its processes, threads and devices; no loop facts (global batch, data)."""
    import os

    import yaml

    os.makedirs(SCRIPT_DIR, exist_ok=True)
    with open(os.path.join(SCRIPT_DIR, "train.py"), "w") as fh:
        fh.write("print('hello')\n")
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "myscript.yaml").write_text(yaml.safe_dump({
        "name": "myscript", "description": "my own DDP script", "strategy": "script", "devices": 2,
        "train": {"threads_per_rank": 2},  # auto would be this machine's cores / 2
        "script": {"path": "train.py", "args": ["--epochs", "3", "--name", "a b"], "env": {"NCCL_DEBUG": "INFO"},
                   "cwd": SCRIPT_DIR}}))
    monkeypatch.setenv("TORCHDECK_PRESETS", str(presets))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # exported, it would be the threads shown
    app = TorchdeckApp(preset="myscript", gpu_source=fake_gpus(), runs_root=tmp_path / "runs")
    assert snap_compare(app, terminal_size=size, run_before=settle)
