"""Packaging is behaviour: the wheel carries the presets and runs without the checkout on the path."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_lists_presets_and_runs_quickstart(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (wheel,) = wheels.glob("torchdeck-*.whl")
    # A fresh environment that borrows this one's dependencies (torch is GBs) but not torchdeck:
    # only directories on its path, whose .pth files (the editable install of this checkout) are
    # not read.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")] or [sysconfig.get_paths()["purelib"]]
    (site / "_deps.pth").write_text("".join(p + "\n" for p in deps))
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCHDECK_PRESETS", "TORCHDECK_RUNS")}
    env["TORCHDECK_PRESETS"] = str(tmp_path / "user-presets")
    exe = venv / "bin" / "torchdeck"
    where = subprocess.run([str(py), "-c", "import torchdeck.engine, torchdeck.presets; print(torchdeck.engine.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert str(site) in where.stdout and str(ROOT) not in where.stdout, where.stdout + where.stderr
    for name in ("engine", "app", "cli", "presets"):  # one namespace: a user's engine.py is theirs alone
        r = subprocess.run([str(py), "-c", f"import {name}"], cwd=elsewhere, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (name, r.stdout, r.stderr)
    r = subprocess.run([str(exe), "presets"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "quickstart (default)" in r.stdout and "fsdp" in r.stdout
    r = subprocess.run([str(exe), "run", "quickstart", "--set", "train.max_steps=3", "--set", "train.epochs=1",
                        "--set", "data.train_size=512", "--set", "data.val_size=128"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run finished" in r.stdout
    (run,) = (elsewhere / "runs").iterdir()
    assert (run / "status.json").is_file() and not (run / "supervisor.pid").exists()


def test_every_package_folder_is_in_the_wheel():
    """pyproject lists the torchdeck.* packages by name (each maps to a folder of the checkout):
    a new subpackage left out of the list would be missing from the wheel alone."""
    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"torchdeck." + ".".join(p.parent.relative_to(ROOT).parts)
               for top in ("engine", "app", "cli") for p in (ROOT / top).rglob("__init__.py")}
    folders |= {".".join(p.parent.relative_to(ROOT).parts)  # torchdeck's own subpackages (integrations)
                for p in (ROOT / "torchdeck").rglob("*/__init__.py")}
    assert folders | {"torchdeck", "torchdeck.presets"} == set(setup["packages"])
    assert setup["package-dir"] == {f"torchdeck.{n}": n for n in ("engine", "app", "cli", "presets")}
