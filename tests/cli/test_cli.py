"""`torchdeck` headless commands, run as a user runs them (real subprocesses, real runs)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchdeck.cli import main as cli
from torchdeck.engine.events import read_all
from torchdeck.engine.strategies import world_size

TORCHDECK = Path(sys.executable).with_name("torchdeck")
TINY = """\
name: tiny
description: a run small enough for a test
strategy: cpu
model: {name: mlp, hidden: 32}
data: {dataset: synthetic, train_size: 256, val_size: 64, image_size: 16}
train: {batch_size: 32, epochs: 1, log_every_n_steps: 1}
"""


def torchdeck(*args, cwd, env=None, timeout=180):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    full_env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"), **(env or {}))
    return subprocess.run(cmd + list(args), cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def in_process(capsys, monkeypatch):
    """`torchdeck ARGS` as torchdeck() runs it, through the CLI's main in this process (what the
    `torchdeck` script calls): a refusal or a printout is the same, without a Python start-up
    (~0.15 CPU-s each). Exit codes, signals and pipes keep their real processes."""
    from types import SimpleNamespace

    def call(*args, cwd):
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("TORCHDECK_RUNS", str(Path(cwd) / "runs"))
        capsys.readouterr()
        code = cli.main(list(args))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
    return call


def run_dirs(root):
    root = Path(root)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return p


@pytest.mark.slow
def test_run_tiny_config_end_to_end_with_overrides(tmp_path, tiny, capsys, monkeypatch):
    """run, eval, resume and run --resume, each a real `torchdeck` process once; eval's other
    references and refusals are the same command's main in this process (each eval process
    costs a torch import)."""
    r = torchdeck("run", str(tiny), "--set", "train.max_steps=5", "--set", "name=tiny-set", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = run_dirs(tmp_path / "runs")
    assert run.name.endswith("tiny-set")
    assert f"run directory: {run}" in r.stdout
    final = json.loads((run / "status.json").read_text())
    assert final["status"] == "finished"
    assert not (run / "supervisor.pid").exists() and final["supervisor_pid"] > 0  # only while it lives
    evs = read_all(run / "events.jsonl")
    steps = [e for e in evs if e["kind"] == "step"]
    assert steps and max(e["step"] for e in steps) == 5  # --set train.max_steps=5 took effect
    assert "max_steps: 5" in (run / "config.yaml").read_text()
    assert "run finished" in r.stdout
    assert "rank  0 cpu" in r.stdout  # the per-rank line of the final display
    assert "Traceback" not in r.stdout + r.stderr

    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    r = torchdeck("eval", str(ckpt), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(epoch 1, step 5)" in r.stdout and "dataset synthetic: 64 samples" in r.stdout  # 5 of 8 batches
    acc = float(r.stdout.split("accuracy ")[1].split("%")[0])
    val_acc = [e["val_acc"] for e in evs if e["kind"] == "epoch_end"][-1]
    assert acc == pytest.approx(100 * val_acc, abs=0.01)  # same model, same val set as the run saw
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))  # as torchdeck() sets it
    monkeypatch.chdir(tmp_path)
    assert cli.main(["eval", str(run / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "not a loadable torchdeck checkpoint" in err and "Traceback" not in err
    for ref in (str(run), "latest", run.name):  # a run: its newest checkpoint
        code, out = cli.main(["eval", ref]), capsys.readouterr()
        assert code == 0 and f"checkpoint {ckpt}" in out.out, (ref, out)
    assert cli.main(["eval", "no-such-run"]) == 2
    assert "no such checkpoint file or run" in capsys.readouterr().err

    # resume: a new run from the old one's newest checkpoint, with more steps; its curve continues
    r = torchdeck("resume", "latest", "--set", "train.max_steps=8", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming {run.name} from {ckpt.name} (step 5)" in r.stdout
    new = next(p for p in run_dirs(tmp_path / "runs") if p != run)
    origin = json.loads((new / "origin.json").read_text())
    assert origin["resumed_from"] == str(run) and origin["checkpoint"] == str(ckpt)
    assert origin["overrides"] == ["train.max_steps=5", "name=tiny-set", "train.max_steps=8"]
    steps = [e["step"] for e in read_all(new / "events.jsonl") if e["kind"] == "step"]
    assert steps and min(steps) == 6 and max(steps) == 8  # continued, not restarted
    assert "resumed from" in r.stdout and "end of epoch" not in r.stdout.split("resumed from")[1][:60]
    from torchdeck.engine.runs.follow import Follower

    f = Follower(new)
    f.poll(force=True)
    assert [x for x, _ in f.view.steps.points] == list(range(1, 9))  # the old curve, then the new
    r = torchdeck("run", str(tiny), "--resume", str(new), "--set", "train.max_steps=9", "--set", "train.epochs=2",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (third,) = [p for p in run_dirs(tmp_path / "runs") if p not in (run, new)]
    assert json.loads((third / "origin.json").read_text())["resumed_from"] == str(new)
    assert [e["step"] for e in read_all(third / "events.jsonl") if e["kind"] == "step"] == [9]


@pytest.mark.slow
def test_failing_run_exits_1_with_root_cause(tmp_path, tiny):
    (tmp_path / "badmodel.py").write_text(textwrap.dedent("""\
        def build(info, **kw):
            raise RuntimeError("boom from the user model")
    """))
    r = torchdeck("run", str(tiny), "--set", "model.name=badmodel:build", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "run failed" in out
    assert "root cause" in out and "boom from the user model" in out
    assert "rank 0" in out
    (run,) = run_dirs(tmp_path / "runs")
    assert json.loads((run / "status.json").read_text())["status"] == "failed"


def test_bad_preset_exits_2_names_field_and_starts_nothing(tmp_path, tiny):
    tiny.write_text(TINY.replace("batch_size: 32", "batch_size: -4") + "optimizer: {lr: -1}\n")
    r = torchdeck("run", str(tiny), cwd=tmp_path)
    assert r.returncode == 2
    assert f"{tiny}: train.batch_size: must be at least 1, got -4" in r.stderr
    assert f"{tiny}: optimizer.lr: must be positive" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert run_dirs(tmp_path / "runs") == []


def test_unknown_key_did_you_mean(tmp_path, tiny, capsys):
    tiny.write_text(TINY.replace("epochs: 1", "epochs: 1, epoch: 2"))
    assert cli.main(["run", str(tiny), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "train.epoch: unknown key (did you mean 'train.epochs'?)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_set_override_is_validated_too(tmp_path, tiny, capsys, monkeypatch):
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    assert cli.main(["run", str(tiny), "--set", "backend=nccl", "--set", "strategy=ddp", "--set", "devices=2"]) == 2
    err = capsys.readouterr().err
    assert "backend: nccl needs CUDA GPUs" in err
    assert cli.main(["validate", str(tiny), "--set", "strategy=ddp", "--set", "devices=3",
                     "--set", "train.grad_accum=2"]) == 0
    out = capsys.readouterr().out
    assert "world size 3" in out and "32 per process x 3 x accumulation 2 = 192" in out
    assert "devices per rank: ranks 0-2: cpu" in out  # identical ranks said once (fmt.rank_groups)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override,field,words", [
    ("data.dataset=imagefolder", "data.root", "no such folder"),
    ("checkpoint.resume=/nonexistent/ckpt-1.pt", "checkpoint.resume", "no such checkpoint file"),
    ("model.name=no_such_pkg_xyz.models:net", "model.name", "no_such_pkg_xyz"),
    ("data.dataset=no_such_pkg_xyz:data", "data.dataset", "no_such_pkg_xyz"),
    ("data.dataset=cifar10", "data.root", "data.download is false"),
])
def test_preflight_checks(tmp_path, tiny, capsys, monkeypatch, override, field, words):
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    extra = ["--set", f"data.root={tmp_path / 'nope'}"] if "imagefolder" in override or "cifar" in override else []
    extra += ["--set", "data.download=false"] if "cifar" in override else []
    assert cli.main(["run", str(tiny), "--set", override, *extra]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and words in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_unknown_preset_name(tmp_path, capsys):
    assert cli.main(["run", "quikstart", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "no preset of that name" in err and "did you mean 'quickstart'" in err
    assert not (tmp_path / "runs").exists()


def test_unwritable_runs_dir(tmp_path, tiny, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cli.main(["run", str(tiny), "--runs-dir", str(blocker / "runs")]) == 2
    assert "cannot create the run directory" in capsys.readouterr().err


def test_presets_command_lists_shipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHDECK_PRESETS", raising=False)
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "STRATEGY", "DESCRIPTION"]
    assert lines[1].startswith("quickstart (default)") and "shipped" in lines[1] and "ddp" in lines[1]
    for name in ("cpu", "gpu", "ddp-cpu", "ddp-gpu"):
        assert any(ln.startswith(name + " ") for ln in lines), name
    assert str(tmp_path / "torchdeck" / "presets") in out


def test_validate_gpu_preset_says_why_it_cannot_run_here(capsys):
    """Refused, naming accelerator, on a host without a GPU; valid on one with a GPU (devices: [0])."""
    from torchdeck.engine.hardware import detect_hardware

    code = cli.main(["validate", "gpu"])
    err = capsys.readouterr().err
    if detect_hardware().gpu_count == 0:
        assert code == 2 and "accelerator: cuda needs an NVIDIA GPU" in err, err
    else:
        assert code == 0, err


@pytest.fixture(scope="module")
def env_report(tmp_path_factory):
    """One real `torchdeck env` (it imports torch: ~2 CPU-s), read by every test of what it says."""
    return torchdeck("env", cwd=tmp_path_factory.mktemp("env"))


def test_env_report(env_report):
    r = env_report
    assert r.returncode == 0, r.stderr
    for key in ("- torchdeck: 0.1.0", "- python: ", "- torch: ", "- textual: ", "- CUDA available: ",
                "nccl", "mpi", "- GPUs (NVML): ", "- CPUs: "):
        assert key in r.stdout, key


def test_help_is_fast_and_lists_commands(tmp_path):
    r = torchdeck("--help", cwd=tmp_path)
    assert r.returncode == 0
    for c in ("run", "attach", "runs", "stop", "presets", "validate", "eval", "env", "export"):
        assert c in r.stdout
    code = ("import sys, torchdeck.cli.main; torchdeck.cli.main.build_parser(); "
            "assert 'torch' not in sys.modules and 'textual' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_runs_and_attach_on_a_recorded_run(tmp_path, capsys):
    """attach replays a finished run from its events alone; runs lists it."""
    from torchdeck.engine import config as c
    from torchdeck.engine import events
    from torchdeck.engine.rundir.layout import RunDir

    run = RunDir.create(c.from_dict({"name": "old"}), tmp_path)
    evs = [events.make("run_started", strategy="cpu", world_size=1, total_steps=2, global_batch=64, devices=["cpu"]),
           events.make("rank_ready", rank=0, local_rank=0, device="cpu", pid=1, host="h", threads=1),
           events.make("step", rank=0, epoch=0, step=2, total_steps=2, loss=0.5, samples_per_s=100.0,
                       data_wait_s=0.1, compute_s=0.9, lr=0.1, accuracy=None),
           events.make("epoch_end", rank=0, epoch=0, step=2, train_loss=0.5, train_acc=0.8, val_loss=0.4, val_acc=0.93),
           events.make("run_finished", status="finished", exit_codes=[0], root_cause=None, elapsed_s=3.0)]
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0], "root_cause": None}))
    assert cli.main(["attach", "latest", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "val loss 0.4000 acc 93.0%" in out and "run finished" in out and "val accuracy 93.0%" in out
    assert "the run goes on" not in out and "the run is over (finished); its history:" in out  # issue 27
    assert "epoch 1 done at step 2" in out  # epochs counted from 1 (the event's epoch 0)
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert run.name in out and "finished" in out
    assert cli.main(["stop", run.name, "--runs-dir", str(tmp_path)]) == 1
    assert "not running" in capsys.readouterr().out
    assert cli.main(["attach", "nope", "--runs-dir", str(tmp_path)]) == 2


# ----------------------------------------------------------------------------- export (issue 7)

def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_export_sbatch_is_valid_bash_and_embeds_the_validated_config(tmp_path, capsys):
    import re

    from torchdeck.engine import config as c

    assert cli.main(["export", "quickstart", "--sbatch", "--set", "nodes.num_nodes=2",
                     "--set", "nodes.master_port=29411", "--set", "nodes.ifname=eth0"]) == 0
    script = capsys.readouterr().out
    (tmp_path / "job.sbatch").write_text(script)
    r = subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2" in script and "srun --ntasks-per-node=1" in script
    assert '-m torchdeck.engine.slurm.node "$TD_RUN_DIR"' in script  # a supervisor per node (engine/slurm)
    embedded = re.search(r"<<'TORCHDECK_CONFIG_EOF'\n(.*?)TORCHDECK_CONFIG_EOF\n", script, re.S).group(1)
    cfg = c.loads(embedded)
    assert cfg.nodes.num_nodes == 2 and world_size(cfg) == 4 and cfg.name == "quickstart"
    assert cfg.nodes.master_port == 29411 and cfg.nodes.ifname == "eth0"  # the supervisors read them there


def test_export_torchrun_with_overrides_needs_a_written_config(tmp_path, capsys):
    assert cli.main(["export", "quickstart", "--torchrun", "--set", "train.epochs=1"]) == 2
    assert "--write-config" in capsys.readouterr().err
    assert cli.main(["export", "quickstart", "--torchrun"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2 -m torchdeck.engine.worker" in out
    assert 'presets/quickstart.yaml --run-dir "runs/$(date +%Y%m%d-%H%M%S)-quickstart-node0"' in out


def test_each_launch_of_an_exported_torchrun_line_gets_a_new_run_directory(tmp_path, capsys):
    """Issue 14 rough edge 11: every launch of the exported line used runs/<name>-node0, so a second
    launch appended to the first run's events. The line names the directory by the launch time,
    as `torchdeck run` names its own: bash expands it when the line runs."""
    import re
    import time

    assert cli.main(["export", "quickstart", "--torchrun", "--run-root", str(tmp_path / "my runs")]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("torchrun")]
    # torchrun stands in as a shell function printing the directory it was given, as torchrun would
    # hand it to engine.worker; the line itself is run by bash as the user would run it
    probe = 'torchrun() { while [ "$1" != --run-dir ]; do shift; done; printf "%s\\n" "$2"; }\n' + line
    dirs = []
    for launch in range(2):
        if launch:  # into the next second (the name's resolution), not a whole second more
            time.sleep(1.01 - time.time() % 1.0)
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        dirs.append(r.stdout.strip())
    assert dirs[0] != dirs[1], dirs
    for d in dirs:
        assert re.fullmatch(re.escape(str(tmp_path / "my runs")) + r"/\d{8}-\d{6}-quickstart-node0", d), d


def test_export_sbatch_asks_for_the_cpus_its_ranks_use(capsys):
    """Issue 14 rough edge 11: without --cpus-per-task SLURM gives the one task (torchrun and all
    its ranks) a single CPU. Each rank gets its threads plus its data loader workers."""
    def cpus(*sets):
        assert cli.main(["export", "quickstart", "--sbatch", *sum((["--set", s] for s in sets), [])]) == 0
        script = capsys.readouterr().out
        found = [ln for ln in script.splitlines() if ln.startswith("#SBATCH --cpus-per-task=")]
        assert len(found) == 1, script
        return int(found[0].split("=")[1])

    assert cpus() == 2 * 4  # 2 ranks x 4 threads (threads_per_rank 0: auto, 4 asked for each)
    assert cli.main(["export", "quickstart", "--sbatch"]) == 0
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-8}"' in capsys.readouterr().out  # srun, since Slurm 22.05
    assert cpus("train.threads_per_rank=3", "data.num_workers=2") == 2 * (3 + 2)


def test_export_a_gpu_preset_from_a_host_without_gpus(capsys):
    """A cluster's login node often has no GPU: export checks everything but this host's GPUs
    (which the job's nodes have, not this host); devices -1 cannot be exported, it names no count."""
    import re

    from torchdeck.engine import config as c

    assert cli.main(["export", "ddp-gpu", "--sbatch", "--set", "nodes.num_nodes=2",
                     "--set", "nodes.master_port=29411", "--set", "devices=[0,1,2,3]"]) == 0
    script = capsys.readouterr().out
    embedded = re.search(r"<<'TORCHDECK_CONFIG_EOF'\n(.*?)TORCHDECK_CONFIG_EOF\n", script, re.S).group(1)
    cfg = c.loads(embedded)
    assert cfg.accelerator == "cuda" and cfg.devices == [0, 1, 2, 3] and world_size(cfg) == 8
    assert "#SBATCH --gpus-per-node=4" in script, script
    assert cli.main(["export", "ddp-gpu", "--sbatch", "--set", "devices=[0,1,2,3]", "--set", "slurm.gpus_per_node=8",
                     "--set", "slurm.partition=gpu", "--set", "slurm.sbatch_args=--mem=64G --exclusive"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=8\n" in script and "#SBATCH --partition=gpu\n" in script
    assert "#SBATCH --mem=64G\n#SBATCH --exclusive\n" in script

    assert cli.main(["export", "ddp-gpu", "--sbatch", "--set", "devices=-1"]) == 2
    assert "cannot know how many GPUs" in capsys.readouterr().err
    assert cli.main(["export", "ddp-gpu", "--sbatch", "--set", "train.batch_size=0"]) == 2  # the rest is checked
    assert "train.batch_size" in capsys.readouterr().err


@pytest.mark.slow
def test_exported_two_node_torchrun_commands_run_and_match_the_supervisor(tmp_path, tiny, capsys):
    """The exported lines themselves (env prefix included), run by bash as two nodes on loopback
    (--nnodes 2, one rank each), write each node's run directory and reach the same weights as
    the same config launched by `torchdeck run` with 2 local ranks."""
    import torch

    port = _free_port()
    cfg_file = tmp_path / "two-node.yaml"
    sets = ["--set", "strategy=ddp", "--set", "train.max_steps=4", "--set", "nodes.num_nodes=2",
            "--set", f"nodes.master_port={port}", "--set", "nodes.ifname=lo", "--set", "name=tn",
            "--set", "train.report_every_s=0.01"]
    assert cli.main(["export", str(tiny), "--torchrun", *sets, "--write-config", str(cfg_file),
                     "--run-root", str(tmp_path / "tr")]) == 0
    cmds = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    assert len(cmds) == 2 and all(c.startswith("GLOO_SOCKET_IFNAME=lo torchrun --nnodes 2 --nproc-per-node 1")
                                  for c in cmds)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    procs = [subprocess.Popen(["bash", "-c", c], cwd=tmp_path, stdout=subprocess.PIPE, env=env,
                              stderr=subprocess.STDOUT, text=True) for c in cmds]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:  # a node that hangs must not outlive the test
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    for k in (0, 1):
        (node,) = (tmp_path / "tr").glob(f"*-tn-node{k}")  # <launch time>-<name>-node<k>
        evs = read_all(node / "events.jsonl")
        assert evs[0]["kind"] == "run_started" and evs[0]["node_rank"] == k and evs[0]["world_size"] == 2
        assert max(e["step"] for e in evs if e["kind"] == "step" and e["rank"] == k) == 4
        assert {e["rank"] for e in evs if e["kind"] == "rank_ready"} == {k}
        assert evs[-1]["kind"] == "run_finished" and evs[-1]["status"] == "finished"
        assert json.loads((node / "status.json").read_text())["status"] == "finished"
    (node0,) = (tmp_path / "tr").glob("*-tn-node0")
    reports = [e for e in read_all(node0 / "events.jsonl") if e["kind"] == "rank_report"]
    assert reports and [r["node_rank"] for r in reports[-1]["reports"]] == [0, 1]
    ckpt_tr = node0 / "checkpoints" / "ckpt-00000004.pt"

    r = torchdeck("run", str(tiny), "--set", "strategy=ddp", "--set", "devices=2", "--set", "train.max_steps=4",
                  "--set", "nodes.master_port=0", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = run_dirs(tmp_path / "runs")
    a = torch.load(ckpt_tr, weights_only=True)["model"]
    b = torch.load(run / "checkpoints" / "ckpt-00000004.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- hardware probe

def test_hardware_probe_never_raises_and_explains_a_missing_gpu(monkeypatch):
    from torchdeck.engine import hardware

    ok, why = hardware.nvml_status()
    hw = hardware.detect_hardware()
    gpus = hardware.list_gpus()
    assert hw.gpu_count == len(gpus) and hw.cpu_count >= 1
    import torch.distributed as dist

    assert hw.mpi_available is dist.is_mpi_available()
    if ok:
        assert why == "" and all(g.name and g.memory_total_mb > 0 for g in gpus)
        assert [g.index for g in gpus] == list(range(len(gpus)))
    else:
        assert gpus == [] and hw.gpu_count == 0
        assert "NVIDIA" in why or "NVML" in why or "nvidia-ml-py" in why
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.visible_devices_warning() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert "physical GPUs 6 and 7" in hardware.visible_devices_warning()


def test_hardware_probe_without_nvidia_ml_py():
    code = ("import sys; sys.modules['pynvml'] = None\n"
            "from torchdeck.engine import hardware\n"
            "print(hardware.nvml_status(), hardware.detect_hardware().gpu_count, hardware.list_gpus())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(False, 'nvidia-ml-py is not installed') 0 []"


# ----------------------------------------------------------------------------- MPI, found without torch

MPI_PROBE = ("import sys\nfrom torchdeck.engine import hardware\n"
             "print(hardware.detect_hardware().mpi_available, hardware.torch_links('libnccl'), 'torch' in sys.modules)")


def test_mpi_probe_agrees_with_torch_without_importing_it():
    """The detector reads torch's shared libraries (an MPI build links libmpi) instead of importing
    torch, which costs the CLI and the app seconds. Its answers equal torch's own, for MPI and, as
    a check that the reader sees real links, for NCCL (which a CUDA build of torch links)."""
    import torch.distributed as dist

    r = subprocess.run([sys.executable, "-c", MPI_PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    mpi, nccl, imported = r.stdout.split()
    assert imported == "False", "the probe imported torch"
    assert mpi == str(dist.is_mpi_available())
    assert nccl == str(dist.is_nccl_available())


def test_elf_reader_lists_what_readelf_lists():
    import re
    import shutil

    from torchdeck.engine import hardware

    if shutil.which("readelf") is None:
        pytest.skip("no readelf here to compare with")
    import importlib.util

    lib = Path(importlib.util.find_spec("torch").origin).parent / "lib"
    sos = sorted(lib.glob("libtorch*.so*")) + [Path(sys.executable).resolve()]
    for so in sos:
        out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, timeout=60).stdout
        assert hardware.elf_needed(so) == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out), so
    assert hardware.elf_needed(__file__) is None  # not ELF: no answer rather than a wrong one


def test_mpi_probe_sees_a_torch_built_with_mpi(tmp_path):
    """This host's torch has no MPI: a stand-in torch whose libtorch_cpu.so links a libmpi, built
    with the real toolchain, must be seen as an MPI build and its config accepted."""
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the stand-in libraries")
    lib = tmp_path / "fake" / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (tmp_path / "empty.c").write_text("int td_probe_symbol(void) { return 0; }\n")
    for cmd in (["gcc", "-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o", str(lib / "libmpi.so.40"), "empty.c"],
                ["gcc", "-shared", "-fPIC", "-o", str(lib / "libtorch_cpu.so"), "empty.c", f"-L{lib}", "-Wl,--no-as-needed",
                 "-l:libmpi.so.40"]):
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    code = MPI_PROBE + ("\nfrom torchdeck.engine.preflight import from_dict\n"
                        "print(from_dict({'strategy': 'ddp', 'devices': 2, 'backend': 'mpi'},"
                        " hw=hardware.detect_hardware()).backend)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "fake")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "False", "mpi"]


def test_validate_refuses_mpi_where_torch_has_none(tmp_path, in_process):
    """`backend: mpi` is refused before anything starts, on the field, with what to use instead."""
    import torch.distributed as dist

    r = in_process("validate", "quickstart", "--set", "backend=mpi", cwd=tmp_path)
    if dist.is_mpi_available():
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2, r.stdout + r.stderr
    assert "backend: this PyTorch build has no MPI support" in r.stderr and "use gloo" in r.stderr, r.stderr
    r = in_process("run", "quickstart", "--set", "backend=mpi", cwd=tmp_path)
    assert r.returncode == 2 and "backend:" in r.stderr and not (tmp_path / "runs").exists()


def test_validate_and_export_warn_of_several_nodes_at_loopback(tmp_path, in_process):
    """Issue 14 rough edge 9: valid (several nodes on one host is a rehearsal), but said up front."""
    r = in_process("validate", "quickstart", "--set", "nodes.num_nodes=2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning: nodes.master_addr: 127.0.0.1 is this host itself" in r.stdout, r.stdout
    two = tmp_path / "two.yaml"
    two.write_text("strategy: ddp\ndevices: 2\nnodes: {num_nodes: 2}\n")
    r = in_process("export", str(two), "--torchrun", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "# warning: nodes.master_addr: 127.0.0.1 is this host itself" in r.stdout, r.stdout
    r = in_process("validate", "quickstart", "--set", "nodes.num_nodes=2", "--set", "nodes.master_addr=10.1.2.3",
                   cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stdout, r.stdout


def test_a_set_typo_is_blamed_on_set_not_on_the_preset(capsys):
    """Issue 14: `--set train.epoch=3` said `.../presets/quickstart.yaml: train.epoch: unknown key`."""
    assert cli.main(["validate", "quickstart", "--set", "train.epoch=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("--set: train.epoch: unknown key") and "epochs" in err[0], err
    assert cli.main(["validate", "quickstart", "--set", "train.batch_size=0"]) == 2
    assert capsys.readouterr().err.startswith("--set: train.batch_size: ")


def test_one_run_reads_the_same_duration_everywhere(tmp_path, capsys):
    """Issue 14: one run showed 00:12, 0:14 and 14.755 s. attach, runs and the reducer agree now."""
    from torchdeck.engine import config as c
    from torchdeck.engine import events
    from torchdeck.engine.runs.catalog import collect
    from torchdeck.engine.runs.follow import Follower
    from torchdeck.engine.rundir.layout import RunDir

    run = RunDir.create(c.from_dict({"name": "timed"}), tmp_path)
    t0 = 1_700_000_000.0
    evs = [dict(events.make("run_started", strategy="cpu", world_size=1, total_steps=2), t=t0 + 2.0),
           dict(events.make("step", rank=0, epoch=0, step=2, total_steps=2, loss=0.5), t=t0 + 10.0),
           dict(events.make("run_finished", status="finished", exit_codes=[0], root_cause=None, elapsed_s=14.755),
                t=t0 + 12.0)]
    run.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    run.write_final("finished", None, [0], 14.755)
    f = Follower(run)
    f.poll(force=True)
    assert f.view.elapsed(t0 + 99) == 14.755
    (row,) = collect(tmp_path)
    assert row.cells()["duration"] == "00:14"
    assert cli.main(["attach", str(run.path)]) == 0
    assert "run finished after 00:14" in capsys.readouterr().out


# ----------------------------------------------------------------------------- issue 27: the user's own module

USER_MODULE = """\
import torch
from torch import nn
from torch.utils.data import TensorDataset


def data(cfg):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 0).long()
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), {"num_classes": 2}


def net(info, hidden=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(info.in_channels * info.image_size ** 2, hidden), nn.ReLU(),
                         nn.Linear(hidden, info.num_classes))
"""


def test_eval_finds_the_users_module_where_run_found_it(tmp_path):
    """Issue 27: `torchdeck run` found irislike.py beside the preset, `torchdeck eval latest` from
    the same folder said `cannot import irislike: ModuleNotFoundError`. Every command now looks
    where the run looked (engine.usercode), and eval from another folder uses the run's own."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "irislike.py").write_text(USER_MODULE)
    (proj / "iris.yaml").write_text("name: iris\nstrategy: cpu\nmodel: {name: 'irislike:net'}\n"
                                    "data: {dataset: 'irislike:data'}\ntrain: {batch_size: 16, epochs: 1}\n")
    runs = ("--runs-dir", str(tmp_path / "runs"))
    r = torchdeck("run", "iris.yaml", *runs, cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr
    r = torchdeck("eval", "latest", *runs, cwd=proj)
    assert r.returncode == 0 and "dataset irislike:data: 32 samples" in r.stdout, r.stdout + r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = torchdeck("eval", "latest", *runs, cwd=elsewhere)  # the run's recorded folder, not this one
    assert r.returncode == 0 and "dataset irislike:data: 32 samples" in r.stdout, r.stdout + r.stderr
    # validate --memory builds the user's model in the CLI's own process: the same lookup
    r = torchdeck("validate", str(proj / "iris.yaml"), "--memory", "--set", "data.dataset=synthetic",
                  cwd=elsewhere)
    assert r.returncode == 0 and "memory per rank" in r.stdout, r.stdout + r.stderr


def _finished_run(root: Path, epochs: int = 1, max_steps: int = 0, step: int = 30) -> Path:
    """A run directory as a finished 1-epoch run leaves it: its events (a checkpoint at the end of
    its last epoch), status.json and the checkpoint file (refused before anything unpickles it)."""
    import zipfile

    from torchdeck.engine import events
    from tests.run_events import ev, started

    run = root / "20260101-000000-done"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(TINY.replace("epochs: 1", f"epochs: {epochs}, max_steps: {max_steps}"))
    evs = [started(total=step, world=1),
           ev("step", 5, rank=0, epoch=epochs - 1, step=step, total_steps=step, loss=1.0),
           ev("checkpoint", 6, rank=0, epoch=epochs, step=step, path=str(run / "checkpoints" / f"ckpt-{step:08d}.pt")),
           ev("run_finished", 7, status="finished", exit_codes=[0], root_cause=None, elapsed_s=7.0)]
    (run / "events.jsonl").write_text("".join(events.dumps(e) + "\n" for e in evs))
    (run / "status.json").write_text(json.dumps({"status": "finished", "exit_codes": [0], "elapsed_s": 7.0}))
    with zipfile.ZipFile(run / "checkpoints" / f"ckpt-{step:08d}.pt", "w") as z:  # torch.save's container
        z.writestr("archive/data.pkl", b"never unpickled")
    return run


def test_resuming_a_run_with_nothing_left_is_refused_before_anything_starts(tmp_path, tiny, in_process):
    """Issue 27: `torchdeck resume` of a finished run (or with --set train.epochs at or below what
    is done) launched a run that trained nothing (`finished at epoch 1, step 30`, then `step 0/30`),
    exit 0, with a new run directory. It is refused first: exit 2, nothing created, what is done
    and what to raise. `run --resume` and the app's Resume (control.resume_config) say the same."""
    from torchdeck.engine.errors import UsageError
    from torchdeck.engine.runs import control

    run = _finished_run(tmp_path / "runs")
    before = run_dirs(tmp_path / "runs")
    for extra in ([], ["--set", "train.epochs=1"]):  # a real `torchdeck` (its exit status), then main here
        r = torchdeck("resume", str(run), cwd=tmp_path, timeout=60) if not extra else in_process(
            "resume", str(run), *extra, cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert ("cannot be resumed from ckpt-00000030.pt: nothing left to train: its checkpoint is at end of "
                "epoch 1, step 30, where train.epochs=1 ends the run; raise it: --set train.epochs=K (K > 1)") in r.stderr
        assert run_dirs(tmp_path / "runs") == before and "run directory" not in r.stdout
    r = in_process("resume", str(run), "--set", "train.max_steps=20", cwd=tmp_path)
    assert r.returncode == 2 and "train.max_steps=20 and train.epochs=1 end the run; raise both" in r.stderr, r.stderr
    r = in_process("run", str(tiny), "--resume", str(run), cwd=tmp_path)
    assert r.returncode == 2 and "train.epochs=1 ends the run" in r.stderr, r.stdout + r.stderr
    assert run_dirs(tmp_path / "runs") == before
    # the app's Resume (R in the Monitor and the Runs list) calls this one function
    with pytest.raises(UsageError, match="nothing left to train"):
        control.resume_config(run)
    cfg, origin, step, ckpt = control.resume_config(run, ["train.epochs=2"])  # more epochs: allowed
    assert (step, cfg.train.epochs) == (30, 2)


def test_exported_commands_put_runs_under_torchdeck_runs_and_env_names_deepspeed(tmp_path, tiny, env_report,
                                                                                   in_process):
    """Issue 27: `torchdeck export --torchrun` wrote `--run-dir "runs/..."` whatever TORCHDECK_RUNS
    said (its runs then missing from `torchdeck runs`), and `torchdeck env` did not say DeepSpeed's
    version."""
    runs = tmp_path / "runs"  # in_process() sets TORCHDECK_RUNS to it, as torchdeck() does
    r = in_process("export", str(tiny), "--torchrun", cwd=tmp_path)
    assert r.returncode == 0 and f'--run-dir "{runs}/$(date' in r.stdout, r.stdout + r.stderr
    r = in_process("export", str(tiny), "--torchrun", "--run-root", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert f'--run-dir "{tmp_path / "elsewhere"}/$(date' in r.stdout, r.stdout  # --run-root still wins
    r = in_process("export", str(tiny), "--sbatch", cwd=tmp_path)
    assert 'TD_ROOT="${TORCHDECK_RUNS:-$SLURM_SUBMIT_DIR/runs}"' in r.stdout, r.stdout  # read in the job
    r = env_report
    import importlib.util

    from importlib.metadata import version
    want = version("deepspeed") if importlib.util.find_spec("deepspeed") else "not installed"
    assert f"- deepspeed: {want}\n" in r.stdout, r.stdout


def test_the_run_says_which_limit_ends_it(tmp_path, tiny, in_process):
    """Issue 27: the Monitor's header said 'epoch 1/40' for a run train.max_steps ends in epoch 24,
    and --set train.max_steps=1200 was silently capped by epochs=3. One rule (preflight.Length)
    says it in validate, in run_started (the views' epoch total) and in rank 0's start-up line.
    tiny: 256 samples / batch 32 = 8 steps an epoch."""
    r = in_process("validate", str(tiny), "--set", "train.epochs=40", "--set", "train.max_steps=20", cwd=tmp_path)
    assert "length: ends at step 20 (train.max_steps), in epoch 3 of 40" in r.stdout, r.stdout + r.stderr
    r = in_process("validate", str(tiny), "--set", "train.epochs=3", "--set", "train.max_steps=1200", cwd=tmp_path)
    assert ("length: train.max_steps=1200 is more than 3 epochs x 8 steps = 24: train.epochs ends the run "
            "at step 24") in r.stdout, r.stdout + r.stderr
    r = torchdeck("run", str(tiny), "--set", "train.epochs=40", "--set", "train.max_steps=12", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 steps/epoch; ends at step 12 (train.max_steps), in epoch 2 of 40" in r.stdout, r.stdout
    assert "ep 2/2 " in r.stdout and "/40" not in r.stdout, r.stdout  # the epoch it ends in, not 40
    (run,) = run_dirs(tmp_path / "runs")
    evs = read_all(run / "events.jsonl")
    (started,) = [e for e in evs if e["kind"] == "run_started"]
    assert (started["total_steps"], started["end_epoch"], started["ends_by"]) == (12, 2, "train.max_steps")
    assert {e["total_steps"] for e in evs if e["kind"] == "step"} == {12}  # the trainer's rule agrees


@pytest.mark.parametrize("command", ["env", "presets"])
def test_a_closed_output_pipe_ends_the_command_quietly(tmp_path, command):
    """Issue 27: `torchdeck env | head -1` ended with 'BrokenPipeError: [Errno 32] Broken pipe',
    exit 1. The reader is gone before anything is written (its end closed at once, as head's is
    once it has its line): no words on stderr, and 141, the status a shell reports for cat or git
    cut short the same way."""
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    p = subprocess.Popen(cmd + [command], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs")))
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == "", err


def test_the_exported_torchrun_line_prints_progress_as_torchdeck_run_does(tmp_path, tiny, capsys):
    """Issue 27: `torchdeck export X --torchrun`, then that line run: its worker printed nothing
    to the terminal. Global rank 0 now prints what it writes, through torchdeck run's plain-line
    renderer (engine.runs.progress): every log line a pipe would get, status lines, the summary."""
    from torchdeck.engine.runs.progress import LOG_LEVELS, log_text
    from torchdeck.engine.runs.view import RunView

    assert cli.main(["export", str(tiny), "--torchrun", "--run-root", str(tmp_path / "tr")]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "torchrun" in ln and not ln.startswith("#")]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    p = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    (node,) = (tmp_path / "tr").glob("*-tiny-node0")
    view = RunView()
    view.feed_all(read_all(node / "events.jsonl"))
    said = [log_text(ln) for ln in view.logs if ln.level in LOG_LEVELS]
    assert any("epoch 1/1 done at step 8" in s for s in said) and any("checkpoint saved" in s for s in said)
    printed = p.stdout.splitlines()
    assert [s for s in said if s not in printed] == [], p.stdout  # each, as torchdeck run prints it
    assert any(ln.startswith("FINISHED | cpu | world 1 | step 8/8") for ln in printed), p.stdout
    assert printed[-1].startswith("run finished after"), p.stdout
