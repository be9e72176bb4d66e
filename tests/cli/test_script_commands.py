"""A user's script run (`torchdeck launch`) through the commands that answer about runs: each says
what happens to a script (stop: SIGTERM) or that it does not apply and why (eval, resume,
validate --memory), one line, exit 2 -- never the loop's answer (issue 35 bugs 8, 9, 15)."""
import os
import subprocess
import sys
import time
from pathlib import Path

from torchdeck.engine.rundir.layout import RunDir

TORCHDECK = Path(sys.executable).with_name("torchdeck")
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"
PRESET = """\
name: my-script
strategy: script
devices: 2
script:
  path: train.py
  args: [--epochs, 3]
  stop_grace_s: 7
"""


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _wait_for(cond, what, deadline_s=60.0, seen=lambda: ""):
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, f"no {what} within {deadline_s:g} s; last seen: {seen()!r}"
        time.sleep(0.05)


def test_stop_eval_and_resume_of_a_script_run_say_what_applies(tmp_path):
    (tmp_path / "train.py").write_text(SLEEPER)
    r = torchdeck("launch", "--detach", "--nproc-per-node", "1", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = (tmp_path / "runs").iterdir()
    run = RunDir(path)
    log = run.rank_log(0)
    _wait_for(lambda: log.exists() and "started" in log.read_text(), "rank 0 output",
              seen=lambda: log.read_text() if log.exists() else "(no rank0.log)")
    r = torchdeck("stop", run.name, "--wait", "60", cwd=tmp_path)
    out = r.stdout
    assert "ranks get SIGTERM, then SIGKILL after 30 s" in out, out  # script.stop_grace_s, as recorded
    assert "checkpoint" not in out, out  # bug 8: a script gets SIGTERM, torchdeck checkpoints nothing
    assert r.returncode == 0 and "run stopped" in out, out + r.stderr

    r = torchdeck("eval", run.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().count("\n") == 0 and "eval does not apply to a script run" in r.stderr, r.stderr
    assert "first checkpoint" not in r.stderr  # bug 9: not "it ended before its first checkpoint"

    r = torchdeck("resume", run.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "resume does not apply to a script run" in r.stderr and "every_n_steps" not in r.stderr, r.stderr
    r = torchdeck("run", "my-script", "--resume", run.name, cwd=tmp_path)  # the other way to resume
    assert r.returncode == 2 and "resume does not apply to a script run" in r.stderr, r.stdout + r.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 1  # nothing started


def test_validate_memory_of_a_script_preset_does_not_estimate_quickstarts_cnn(tmp_path):
    (tmp_path / "train.py").write_text(SLEEPER)
    (tmp_path / "my-script.yaml").write_text(PRESET)
    r = torchdeck("validate", "my-script.yaml", "--memory", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        "validate --memory does not apply to a script run: the model and batch are your script's, "
        "torchdeck cannot see them before it runs"), r.stderr
    assert "parameters" not in r.stdout + r.stderr  # no estimate of a model the run does not train
    assert torchdeck("validate", "my-script.yaml", cwd=tmp_path).returncode == 0  # without --memory: valid


def test_export_of_a_script_preset_says_the_torchdeck_command_not_a_placeholder(tmp_path):
    (tmp_path / "train.py").write_text(SLEEPER)
    (tmp_path / "my-script.yaml").write_text(PRESET)
    r = torchdeck("export", "my-script.yaml", "--torchrun", "--set", "script.stop_grace_s=5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert "THIS_PRESET" not in r.stdout, first
    assert first.endswith(f"torchdeck run {tmp_path / 'my-script.yaml'} --set script.stop_grace_s=5"), first
