"""A script preset's `script.args` as a YAML list or as one command line (the form takes a command
line; a preset said `must be a list, got "--epochs 3"`): split as a shell splits it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdeck.engine import config as cfgmod

TORCHDECK = Path(sys.executable).with_name("torchdeck")


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


PRESET = "name: mine\nstrategy: script\naccelerator: cpu\ndevices: 1\nscript:\n  path: show.py\n  args: {args}\n"


def test_script_args_as_a_command_line_in_a_preset_reach_the_script(tmp_path):
    (tmp_path / "show.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    (tmp_path / "mine.yaml").write_text(PRESET.format(args="""--epochs 3 --name "a b" ''"""))
    r = torchdeck("run", "mine.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "argv ['--epochs', '3', '--name', 'a b', '']" in r.stdout, r.stdout


def test_script_args_with_an_open_quote_is_one_clear_message(tmp_path):
    (tmp_path / "show.py").write_text("print('never run')\n")
    (tmp_path / "mine.yaml").write_text(PRESET.format(args="""'--name "a b'"""))
    r = torchdeck("run", "mine.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "script.args" in r.stderr and "No closing quotation" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("args, argv", [("--epochs 3", ["--epochs", "3"]), (["--epochs", 3], ["--epochs", "3"]),
                                        ("", []), ("--msg 'it''s'", ["--msg", "its"])])
def test_script_args_a_list_or_a_command_line(args, argv):
    cfg = cfgmod.from_dict({"strategy": "script", "script": {"path": "show.py", "args": args}})
    assert cfg.script.args == argv
