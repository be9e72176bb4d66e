"""torchdeck works from the user's project folder whatever its files are named (issue 29): the
working directory comes first on the path of the CLI's, the supervisor's and the ranks' Python,
and torchvision's detection reference scripts ship an engine.py. Our modules live in one
namespace (torchdeck.engine, ...), so a user's engine.py, app.py, cli.py or presets/ shadows
nothing, and a user's own module named `engine` is theirs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCHDECK = Path(sys.executable).with_name("torchdeck")
SHORT = ["--set", "train.max_steps=2", "--set", "train.epochs=1", "--set", "data.train_size=256",
         "--set", "data.val_size=64"]
USER_FILE = 'raise SystemExit("user file ran: " + __file__)\n'


def torchdeck(*args, cwd):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TORCHDECK_RUNS=str(cwd / "runs"), TORCHDECK_PRESETS=str(cwd.parent / "user-presets"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def finished(r, cwd: Path) -> Path:
    (run,) = (cwd / "runs").iterdir()
    log = (run / "supervisor.log").read_text() if (run / "supervisor.log").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + log
    assert "user file ran" not in r.stdout + r.stderr + log
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    return run


@pytest.mark.slow
def test_a_folder_holding_engine_app_cli_py_and_presets_runs_quickstart(tmp_path):
    """Before: `torchdeck run quickstart` ended 'run lost: the supervisor exited without a final
    status', supervisor.log showing the user's engine.py run in place of ours."""
    work = tmp_path / "detection"
    work.mkdir()
    # torchdeck.py, yaml.py, psutil.py: a cwd first on the supervisor's path would import them
    for name in ("engine.py", "app.py", "cli.py", "torchdeck.py", "yaml.py", "psutil.py"):
        (work / name).write_text(USER_FILE)
    (work / "presets").mkdir()
    (work / "presets" / "__init__.py").write_text(USER_FILE)
    (work / "presets" / "quickstart.yaml").write_text("not: [a preset\n")
    r = torchdeck("run", "quickstart", *SHORT, cwd=work)
    run = finished(r, work)
    assert "run finished" in r.stdout
    steps = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert {e["rank"] for e in steps if e.get("kind") == "step"} == {0, 1}  # both ranks trained


@pytest.mark.slow
def test_a_users_model_in_a_module_named_engine_trains(tmp_path):
    """`model.name: engine:mymodel` is the user's engine.py (theirs to name), on both ranks, and
    so is its data set in the loader workers (a fork server's, which unpickle it)."""
    work = tmp_path / "proj"
    work.mkdir()
    (work / "engine.py").write_text(
        "import os\n"
        "import torch\n"
        "from torch import nn\n"
        "def mymodel(info):\n"
        "    with open(os.path.join(os.path.dirname(__file__), 'built'), 'a') as f:\n"
        "        f.write(os.environ.get('RANK', '?') + '\\n')\n"
        "    return nn.Sequential(nn.Flatten(),\n"
        "                         nn.Linear(info.in_channels * info.image_size ** 2, info.num_classes))\n"
        "class Squares(torch.utils.data.Dataset):\n"  # unpickled by a loader worker: found there too
        "    def __init__(self, n): self.n = n\n"
        "    def __len__(self): return self.n\n"
        "    def __getitem__(self, i): return torch.full((1, 8, 8), i % 10 / 10.0), i % 10\n"
        "def mydata(cfg):\n"
        "    return Squares(256), Squares(64), {'num_classes': 10}\n")
    (work / "torchdeck.py").write_text(USER_FILE)  # and a torchdeck.py there is not torchdeck
    r = torchdeck("run", "quickstart", "--set", "model.name=engine:mymodel", "--set", "data.dataset=engine:mydata",
                  "--set", "data.num_workers=1", *SHORT, cwd=work)
    run = finished(r, work)
    assert "name: engine:mymodel" in (run / "config.yaml").read_text()
    assert sorted((work / "built").read_text().split()) == ["0", "1"]  # each rank built the user's model


def test_a_command_looks_in_its_own_folders_not_in_ones_its_environment_inherited(tmp_path):
    """TORCHDECK_USER_FOLDERS carries a run's folders to the processes it starts; a command typed
    in a shell that holds another's (a test harness that ran `torchdeck` in-process before) found
    that folder's typo_mod.py first and named it."""
    other, work = tmp_path / "other", tmp_path / "proj"
    for d in (other, work):
        d.mkdir()
        (d / "typo_mod.py").write_text("def build(info):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TORCHDECK_RUNS=str(work / "runs"), TORCHDECK_USER_FOLDERS=str(other))
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    r = subprocess.run(cmd + ["validate", "quickstart", "--set", "model.name=typo_mod:biuld"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout + r.stderr
    assert str(work / "typo_mod.py") in r.stderr + r.stdout and str(other) not in r.stderr + r.stdout, r.stderr
