"""One preflight for both launch paths: a config the CLI refuses, the app refuses too, with the
same words on the field (issue 13: the app used to check only this host's interfaces)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.sources.nvml import FakeGPUSource
from torchdeck.cli import main as cli

PRESET = """\
name: checked
strategy: cpu
model: {{name: {model}}}
data: {{dataset: {dataset}, root: {root}}}
train: {{batch_size: 8, epochs: 1}}
checkpoint: {{resume: {resume}}}
"""

CASES = {
    "missing image folder": dict(model="mlp", dataset="imagefolder", root="{tmp}/no-such-folder", resume="''"),
    "resume file that is not there": dict(model="mlp", dataset="synthetic", root="./data",
                                          resume="{tmp}/gone/ckpt-00000001.pt"),
    "user model that does not parse": dict(model="brokenmodel:build", dataset="synthetic", root="./data",
                                           resume="''"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_app_refuses_what_the_cli_refuses_with_the_same_words(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a user module is looked for in the current directory, by both
    monkeypatch.setenv("TORCHDECK_PRESETS", str(tmp_path / "presets"))
    (tmp_path / "brokenmodel.py").write_text("def build(info:\n    pass\n")
    fields = {k: v.format(tmp=tmp_path) for k, v in CASES[case].items()}
    preset = tmp_path / "checked.yaml"
    preset.write_text(PRESET.format(**fields))

    assert cli.main(["run", str(preset), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{preset}: "), err
    field, why = err[0][len(f"{preset}: "):].split(": ", 1)
    assert not (tmp_path / "runs").exists()  # nothing started

    app = TorchdeckApp(preset=str(preset), gpu_source=FakeGPUSource([]), runs_root=tmp_path / "runs")
    said = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            screen = app.screen
            if getattr(screen, "cfg", None) is not None or getattr(screen, "problems", None):
                break
        assert screen.problems.get(field) == why, (screen.problems, field, why)
        await pilot.press("f5")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "ConfigureScreen"
        assert any(s == f"Cannot launch: {field}: {why}" for s in said), said
    assert not (tmp_path / "runs").exists()
