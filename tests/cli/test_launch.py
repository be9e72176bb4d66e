"""`torchdeck launch` (issue 29), the front: torchrun's command line -> a script run's config, the
checks that refuse bad input before anything starts (one line, exit 2, no run directory), and a
preset with a `script:` section through validate/export. Fast: no training, no torch in the scripts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdeck.engine import preflight, strategies
from torchdeck.engine.affinity import usable_cpus
from torchdeck.engine.errors import UsageError
from torchdeck.engine.launch import args as launch_args

TORCHDECK = Path(sys.executable).with_name("torchdeck")


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def project(tmp_path):
    """A user's project folder: a good script, a broken one, a package with a module."""
    (tmp_path / "train.py").write_text("import os\nprint('rank', os.environ['RANK'])\n")
    (tmp_path / "broken.py").write_text("import os\n\n\ndef main(:\n    pass\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported: the check must not import')\n")
    (tmp_path / "pkg" / "train.py").write_text("print('hi')\n")
    return tmp_path


# ----------------------------------------------------------------------------- bad input, real CLI

BAD = {
    "missing script": (["--nproc-per-node", "2", "nope.py", "--epochs", "3"], ["nope.py", "looked in {cwd}"]),
    "module not found": (["-m", "pkg.nope"], ["no module named 'pkg.nope'", "{cwd}"]),
    "syntax error with its line": (["broken.py"], ["broken.py:4: SyntaxError"]),
    "--no-python, no such executable": (["--no-python", "no-such-tool", "--x"], ["no-such-tool", "--no-python"]),
    "GPU that does not exist": (["--devices", "99", "train.py"], ["GPU"]),
    "torchrun flag torchdeck does not support": (["--rdzv-backend", "c10d", "train.py"],
                                                 ["--rdzv-backend is a torchrun flag torchdeck does not support"]),
    "elastic node range": (["--nnodes", "1:4", "train.py"], ["--nnodes 1:4 is an elastic range"]),
    "unknown flag": (["--bogus", "train.py"], ["--bogus"]),
    "no script": (["--nproc-per-node", "2"], ["which script?"]),
    "node rank out of range": (["--nnodes", "2", "--node-rank", "2", "train.py"], ["--node-rank", "0..1"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_started(project, case):
    argv, said = BAD[case]
    r = torchdeck("launch", *argv, cwd=project)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for text in said:
        assert text.format(cwd=project) in lines[0], lines[0]
    assert r.stdout == ""
    assert not (project / "runs").exists()  # no run directory


def test_help_lists_torchruns_flags_and_torchdecks_own_apart(tmp_path):
    r = torchdeck("launch", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    torchrun_part, _, own = r.stdout.partition("torchdeck's own:")
    assert "torchrun's flags" in torchrun_part and "--nproc-per-node" in torchrun_part and "--standalone" in torchrun_part
    assert "--devices" in own and "--env" in own and "--detach" in own and "--nproc-per-node" not in own.split("torchrun flags")[0]
    assert "--rdzv-backend" in own.split("does not support")[1]


# ----------------------------------------------------------------------------- the flag mapping


def config(*argv, gpus=0, cwd="/tmp"):
    return launch_args.to_config(launch_args.parse(list(argv)), cwd, gpu_count=gpus)


@pytest.mark.parametrize("dash, under", [
    (["--nproc-per-node", "3"], ["--nproc_per_node", "3"]),
    (["--node-rank", "1", "--nnodes", "2"], ["--node_rank", "1", "--nnodes", "2"]),
    (["--master-addr", "10.0.0.1", "--master-port", "1234"], ["--master_addr", "10.0.0.1", "--master_port", "1234"]),
    (["--no-python"], ["--no_python"]),
    (["--use-env"], ["--use_env"]),
])
def test_both_spellings_of_torchruns_flags_say_the_same(dash, under):
    assert config(*dash, "train.py") == config(*under, "train.py")


def test_nproc_per_node_values():
    c = config("--nproc-per-node", "3", "train.py")
    assert (c["accelerator"], c["devices"]) == ("cpu", 3)
    c = config("--nproc-per-node", "cpu", "train.py")
    assert (c["accelerator"], c["devices"]) == ("cpu", "auto")
    assert strategies.nproc_per_node(preflight.from_dict(c)) == usable_cpus()  # one per core torchdeck may use
    assert (config("--nproc-per-node", "gpu", "t.py", gpus=2)["accelerator"],
            config("--nproc-per-node", "gpu", "t.py", gpus=2)["devices"]) == ("cuda", -1)
    with pytest.raises(UsageError, match="no GPU"):
        config("--nproc-per-node", "gpu", "t.py", gpus=0)
    assert config("--nproc-per-node", "auto", "t.py", gpus=0)["devices"] == "auto"
    assert config("--nproc-per-node", "auto", "t.py", gpus=4)["devices"] == -1
    with pytest.raises(UsageError, match="expected a number, gpu, cpu or auto"):
        config("--nproc-per-node", "many", "t.py")
    assert config("t.py")["devices"] == 1  # torchrun's default: one process


def test_devices_pick_gpus_and_must_agree_with_nproc():
    c = config("--devices", "0,2", "t.py")
    assert (c["accelerator"], c["devices"]) == ("cuda", "0,2")
    assert config("--devices", "free:2", "--nproc-per-node", "2", "t.py")["devices"] == "free:2"
    with pytest.raises(UsageError, match="disagree"):
        config("--devices", "0,2", "--nproc-per-node", "3", "t.py")


def test_nnodes_a_count_or_a_fixed_range():
    assert config("--nnodes", "2", "t.py")["nodes"]["num_nodes"] == 2
    assert config("--nnodes", "2:2", "t.py")["nodes"]["num_nodes"] == 2
    with pytest.raises(UsageError, match="elastic range"):
        config("--nnodes", "1:4", "t.py")
    assert config("--nnodes", "2", "t.py")["nodes"]["master_port"] == 29500  # torchrun's default port
    assert config("t.py")["nodes"]["master_port"] == 0  # one node: a free one, as --standalone
    with pytest.raises(UsageError, match="--standalone"):
        config("--standalone", "--nnodes", "2", "t.py")


@pytest.mark.parametrize("names", list(launch_args.UNSUPPORTED))
def test_each_torchrun_flag_torchdeck_does_not_support_is_named(names):
    for name in names:
        with pytest.raises(UsageError, match=f"{name} is a torchrun flag torchdeck does not support"):
            config(name, "x", "t.py")


def test_everything_after_the_script_goes_to_it_unchanged():
    c = config("--nproc-per-node", "2", "train.py", "--nproc-per-node", "9", "-h", "--name", "x", "--env", "A=1")
    assert c["script"]["path"] == "train.py" and c["name"] == "train"
    assert c["script"]["args"] == ["--nproc-per-node", "9", "-h", "--name", "x", "--env", "A=1"]
    assert c["devices"] == 2 and c["script"]["env"] == {}
    m = config("-m", "pkg.train", "--lr", "0.1")
    assert (m["script"]["module"], m["script"]["path"], m["script"]["args"], m["name"]) == ("pkg.train", "", ["--lr", "0.1"], "train")


def test_torchdecks_own_flags():
    c = config("--name", "exp1", "--env", "A=1", "--env", "B=x=y", "--local-rank-arg", "train.py", cwd="/tmp")
    assert c["name"] == "exp1" and c["script"]["env"] == {"A": "1", "B": "x=y"}
    assert c["script"]["local_rank_arg"] == "--local-rank" and c["script"]["cwd"] == str(Path("/tmp").resolve())
    assert config("--local-rank-arg=--local_rank", "t.py")["script"]["local_rank_arg"] == "--local_rank"
    assert config("t.py", "--local-rank-arg=--local_rank")["script"]["args"] == ["--local-rank-arg=--local_rank"]
    with pytest.raises(UsageError, match="--use-env and --local-rank-arg"):
        config("--use-env", "--local-rank-arg", "t.py")
    with pytest.raises(UsageError, match="NAME=VALUE"):
        config("--env", "A", "t.py")


def test_module_check_imports_nothing(project):
    """pkg/__init__.py raises when imported: finding pkg.train must not run it."""
    cfg = preflight.from_dict(config("-m", "pkg.train", cwd=project))
    assert preflight.check(cfg) == []


# ----------------------------------------------------------------------------- a preset with a script


SCRIPT_PRESET = """\
name: my-script
strategy: script
devices: 2
train: {batch_size: 0}   # the loop's fields do not apply to a script run
script:
  path: train.py
  args: [--epochs, 3]
  env: {FOO: bar}
"""


def test_a_preset_with_a_script_section_validates_and_says_the_command(project):
    (project / "my-script.yaml").write_text(SCRIPT_PRESET)
    r = torchdeck("validate", "my-script.yaml", cwd=project)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "-m torchdeck.engine.launch.shim train.py --epochs 3" in out  # the command each rank runs
    assert "2 per node x 1 node(s) = world size 2" in out
    assert "RANK, LOCAL_RANK, WORLD_SIZE" in out and "FOO" in out
    assert "threads per rank" in out and "batch" not in out  # no loop fields shown
    r = torchdeck("export", "my-script.yaml", "--torchrun", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "export FOO=bar" in r.stdout
    assert "torchrun --nnodes 1 --nproc-per-node 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500 " \
           "train.py --epochs 3" in r.stdout


def test_a_script_run_exits_with_the_failing_ranks_code(project):
    """Two ranks, rank 1 exits 7: torchdeck launch exits 7 and the run is failed."""
    (project / "fail.py").write_text("import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit(7)\n")
    r = torchdeck("launch", "--nproc-per-node", "2", "fail.py", cwd=project)
    assert r.returncode == 7, r.stdout + r.stderr
    (run,) = (project / "runs").iterdir()
    assert json.loads((run / "status.json").read_text())["status"] == "failed"


def test_the_launch_exits_with_the_first_failing_ranks_code_not_the_stopped_ones(project):
    """Rank 1 exits 7 while rank 0 still runs; torchdeck then stops rank 0 (SIGTERM: a signal's code,
    first in exit_codes). The launch's code is rank 1's 7, the root cause's, as status.json and
    run_finished name it (failed_local_rank), not rank 0's 143."""
    (project / "first.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(7)\n"
        "time.sleep(60)\n")
    r = torchdeck("launch", "--nproc-per-node", "2", "first.py", cwd=project, timeout=60)
    assert r.returncode == 7, r.stdout + r.stderr
    (run,) = (project / "runs").iterdir()
    final = json.loads((run / "status.json").read_text())
    assert final["exit_codes"][1] == 7 and final["exit_codes"][0] != 0, final  # rank 0 ended by torchdeck's stop
    assert final["status"] == "failed" and final["failed_local_rank"] == 1, final
    (done,) = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()
               if '"run_finished"' in ln]
    assert done["failed_local_rank"] == 1
