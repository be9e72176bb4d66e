"""Issue 5 gaps: a hung collective, a kill during a checkpoint save, resume after a SIGKILL of the
whole run, a disk that fills up mid-run, and bad arguments that must start nothing.

Every run here is real (a supervisor in its own session, 2 gloo ranks on CPU) and every kill is a
real signal to a real process. Each test asserts its bound, its message, that no process of the
run is left (by the supervisor's session) and, for distributed runs, that the master port is free.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from torchdeck.engine import events
from torchdeck.engine.runs import control
from torchdeck.engine.rundir.layout import RunDir
from tests.engine.helpers import Run, ddp_cfg, port_free, port_holders

FAIL_MODELS = '''
import os, time
from torchdeck.engine.models import mlp


def hang(info, at=3, rank="1"):
    """Blocks forever in the forward of its `at`-th training step on one rank: the other rank's
    next collective waits for it, as with a deadlocked data loader or a stuck GPU."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank:
                while True:
                    time.sleep(3600)
    net.register_forward_pre_hook(hook)
    return net


def heavy(info, mb=32):
    """The mlp plus a frozen 32 MB tensor: each checkpoint takes a moment to write, long enough
    to be killed in the middle of; training (and so the weights) is the mlp's alone."""
    import torch

    net = mlp(info, 32)
    net.ballast = torch.nn.Parameter(torch.zeros(mb << 18), requires_grad=False)
    return net
'''


def write_models(tmp_path: Path) -> None:
    (tmp_path / "failmodels.py").write_text(FAIL_MODELS)


def session_left(run_dir: Path) -> list[psutil.Process]:
    """Processes still in the run's session (the supervisor's pid is the session id)."""
    return control.run_processes(RunDir(run_dir))


def assert_clean(r: Run, within: float = 5.0) -> None:
    """No process of the run is left, by session and by every pid seen, and its port is free."""
    deadline = time.monotonic() + within
    while session_left(r.dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_left(r.dir), f"left in the run's session: {session_left(r.dir)}"
    r.assert_nothing_left(within=1.0)
    started = [e for e in r.events() if e["kind"] == "run_started"]
    if started:
        # The kernel closes a killed process's sockets as it tears the process down, which can
        # end after the process has left the session's list (seen once in CI: the listener and
        # its two connections still there, owned by no pid); a leaked socket stays.
        port = started[0]["master_port"]
        while not port_free(port) and time.monotonic() < deadline + 2.0:
            time.sleep(0.1)
        assert port_free(port), f"the master port is still taken: {port_holders(port)}"


# ----------------------------------------------------------------------------- a hung collective


@pytest.mark.slow
def test_hung_collective_ends_at_the_configured_timeout_naming_it(tmp_path, runs):
    write_models(tmp_path)
    r = Run(tmp_path, ddp_cfg(**{"model.name": "failmodels:hang", "train.max_steps": 40,
                                 "nodes.timeout_s": 5}))
    runs.append(r)
    r.wait_for(lambda e: e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 2)
    rc = r.wait(timeout=90)
    ended = time.time()
    assert rc == 1, r.output()
    evs = r.events()
    hung_at = max(e["t"] for e in evs if e["kind"] == "step" and e["rank"] == 1)  # rank 1's last report
    err = next(e for e in evs if e["kind"] == "error")
    assert err["rank"] == 0 and err["host"] == socket.gethostname() and "Traceback" in err["traceback"]
    assert 4.5 <= err["t"] - hung_at <= 5 + 5, "rank 0 gave up at the configured 5 s, not before, not much after"
    assert ended - hung_at < 5 + 15, "the run ended within 15 s of the timeout"
    st = r.status()
    assert st["status"] == "failed" and st["exit_codes"][0] == 1
    cause = st["root_cause"]
    assert cause.startswith("rank 0 (") and "a collective timed out after nodes.timeout_s=5 s" in cause, cause
    assert "rank 1 sent no error and had to be stopped: the likely hang (see rank1.log" in cause, cause
    assert "rank 1 was in hook (failmodels.py:" in cause, cause  # from its stacks, taken before it was stopped
    assert [e for e in evs if e["kind"] == "run_finished"][0]["root_cause"] == cause
    assert_clean(r)


# ----------------------------------------------------------------------------- through `torchdeck run`

FAILING_PRESET = """\
name: raises
strategy: ddp
devices: 2
model: {{name: "usermodels:failing", kwargs: {{at: 3, rank: "{rank}"}}}}
data: {{dataset: synthetic, train_size: 4096, val_size: 64, image_size: 8}}
train: {{batch_size: 8, epochs: 20, log_every_n_steps: 1, threads_per_rank: 1}}
nodes: {{master_port: 0}}
"""


def _run_cli(tmp_path: Path, rank: str):
    import subprocess

    from tests.engine.helpers import USER_MODELS, cli_cmd, env_for

    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    (tmp_path / "raises.yaml").write_text(FAILING_PRESET.format(rank=rank))
    log = open(tmp_path / "cli.log", "w")
    proc = subprocess.Popen(cli_cmd() + ["run", "raises.yaml"], cwd=tmp_path, env=env_for(tmp_path),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, tmp_path / "cli.log"


@pytest.mark.slow
def test_rank_raises_torchdeck_run_shows_root_cause_and_traceback_and_leaves_nothing(tmp_path):
    from tests.engine.helpers import the_run

    proc, log = _run_cli(tmp_path, rank="1")
    run = the_run(tmp_path)
    try:
        assert proc.wait(timeout=120) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            control.kill(run)
    ended = time.time()
    evs = events.read_all(run.events_path)
    errors = [e for e in evs if e["kind"] == "error"]
    first = errors[0]
    assert first["rank"] == 1 and first["exception"] == "RuntimeError" and "boom at step 3" in first["message"]
    assert ended - first["t"] < 10, "stopped everywhere within 10 s"
    final = run.final_status()
    assert final["status"] == "failed" and final["root_cause"].startswith("rank 1 (")  # even if rank 0 failed after
    out = log.read_text()
    host = socket.gethostname()
    assert f"[error] rank 1 on {host} (pid {first['pid']}): RuntimeError: boom at step 3" in out
    assert f"root cause: rank 1 ({host}): RuntimeError: boom at step 3" in out
    assert 'in hook' in out and "raise RuntimeError" in out, "the traceback's tail is shown"
    wait_gone(run)
    assert port_free(evs[0]["master_port"])


@pytest.mark.slow
def test_sigkill_of_rank_0_frees_the_port_and_leaves_nothing(tmp_path):
    """Rank 0 is the one users worry about (it used to host the store): killing it must still stop
    rank 1 within 15 s, name the signal, and leave the port free."""
    from tests.engine.helpers import rank_pids, steps_seen, the_run, wait_for

    proc, log = _run_cli(tmp_path, rank="none")  # never raises
    run = the_run(tmp_path)
    try:
        wait_for(lambda: steps_seen(run, 4) and len(rank_pids(run)) == 2, 120, "training steps")
        pids = rank_pids(run)
        os.kill(pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        assert proc.wait(timeout=60) == 1
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            control.kill(run)
    assert run.final_status()["root_cause"] == "rank 0 killed by signal 9 (SIGKILL)"
    assert "rank 0 killed by signal 9" in log.read_text()
    wait_gone(run)
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    port = next(e["master_port"] for e in events.read_all(run.events_path) if e["kind"] == "run_started")
    assert port_free(port)


# ----------------------------------------------------------------------------- kill during a save

KILLED_WRITER = '''
import os, sys, time, torch
from torchdeck.engine import checkpoint as ckpt

d, marker = sys.argv[1], sys.argv[2]
ckpt.save({"model": {"w": torch.ones(4)}, "step": 1}, d, 1, keep_last=3)


def fsync_then_hang(fd):
    """Every byte of the new checkpoint is written, nothing renamed yet: the worst moment to die."""
    open(marker, "w").close()
    time.sleep(120)


ckpt.os.fsync = fsync_then_hang
ckpt.save({"model": {"w": torch.full((1 << 18,), 2.0)}, "step": 2}, d, 2, keep_last=3)
'''


def test_sigkill_in_the_middle_of_a_save_keeps_the_previous_checkpoint(tmp_path):
    import subprocess
    import sys

    import torch

    from torchdeck.engine import checkpoint as ckpt
    from tests.engine.helpers import ROOT

    d, marker = tmp_path / "ck", tmp_path / "in-fsync"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(d), str(marker)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never reached its fsync"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    (tmp,) = [p for p in d.iterdir() if p.name.startswith(".")]
    assert tmp.name.startswith(f".{ckpt.file_name(2)}.tmp-") and tmp.stat().st_size > 1 << 20
    assert [s for s, _ in ckpt.listing(d)] == [1], "the half-saved step 2 is not a checkpoint"
    path, state = ckpt.latest(d)
    assert path.name == ckpt.file_name(1) and torch.equal(state["model"]["w"], torch.ones(4))
    # The next save (a resumed run) sweeps the dead writer's temp file and leaves a clean folder.
    ckpt.save({"model": {}, "step": 3}, d, 3, keep_last=3)
    assert sorted(p.name for p in d.iterdir()) == [ckpt.file_name(1), ckpt.file_name(3)]


def test_a_live_writers_temp_file_is_not_swept(tmp_path):
    from torchdeck.engine import checkpoint as ckpt

    ours = tmp_path / f".{ckpt.file_name(5)}.tmp-{socket.gethostname()}-{os.getpid()}"
    elsewhere = tmp_path / f".{ckpt.file_name(5)}.tmp-some-other-host-1"
    for p in (ours, elsewhere):
        p.write_bytes(b"being written")
    assert ckpt.sweep_stale(tmp_path) == []
    assert ours.exists() and elsewhere.exists()


def test_disk_errors_on_save_become_one_clear_message(tmp_path):
    """A file size limit (ulimit -f) in a real child process: the write fails with EFBIG."""
    import subprocess
    import sys

    from tests.engine.helpers import ROOT

    code = ("import resource, sys, torch\n"
            "from torchdeck.engine import checkpoint as ckpt\n"
            "ckpt.save({'model': {'w': torch.ones(4)}, 'step': 1}, sys.argv[1], 1, keep_last=3)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))\n"
            "try:\n"
            "    ckpt.save({'model': {'w': torch.ones(1 << 20)}, 'step': 2}, sys.argv[1], 2, keep_last=3)\n"
            "except ckpt.CheckpointWriteError as exc:\n"
            "    print(exc.errno, exc)\n")
    d = tmp_path / "ck"
    r = subprocess.run([sys.executable, "-c", code, str(d)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from torchdeck.engine import checkpoint as ckpt

    assert r.stdout.strip() == (
        f"27 cannot write checkpoint {d / ckpt.file_name(2)}: File too large: raise the file size limit "
        f"(ulimit -f), or set checkpoint.dir to another disk; the last complete checkpoint, "
        f"{ckpt.file_name(1)}, is intact")
    assert sorted(p.name for p in d.iterdir()) == [ckpt.file_name(1)], "no temp file left behind"


@pytest.mark.slow
def test_sigkill_of_the_whole_run_during_a_save_then_resume_latest_equals_uninterrupted(
        tmp_path, runs, monkeypatch):
    """SIGKILL the run's process group the moment rank 0 starts writing a checkpoint: the one
    before stays loadable, `resume: latest` in a new run of the same name continues from it,
    and the end result equals an uninterrupted run (one process, batch 2B: see test_equivalence)."""
    from torchdeck.engine import checkpoint as ckpt
    from tests.engine.helpers import assert_same_weights, final_model, run_in_process, small_cfg

    write_models(tmp_path)
    cfg = ddp_cfg(**{"model.name": "failmodels:heavy", "train.max_steps": 12, "checkpoint.every_n_steps": 2,
                     "checkpoint.keep_last": 10, "train.log_every_n_steps": 2})
    r = Run(tmp_path, cfg, name="killed")
    runs.append(r)
    ck = r.dir / "checkpoints"
    deadline = time.monotonic() + 120
    victim, noted = None, float("-inf")
    while victim is None:
        assert time.monotonic() < deadline and r.proc.poll() is None, f"no save to kill: {r.events()[-3:]}"
        if time.monotonic() - noted > 0.25:  # the ranks' pids, for assert_clean: a scan of every
            r.note_children()  # process in /proc, too dear each 2 ms (it took a core from the ranks' start)
            noted = time.monotonic()
        names = [p.name for p in ck.iterdir()] if ck.is_dir() else []
        victim = next((n for n in names if n.startswith(".ckpt-") and int(n[6:14]) >= 4), None)
        if victim is None:
            time.sleep(0.002)
    os.killpg(r.proc.pid, signal.SIGKILL)  # the whole run: supervisor and ranks, as `kill -9 -PGID`
    r.proc.wait(10)
    assert_clean(r)
    killed_at = int(victim[6:14])
    assert (ck / victim).exists() and not (ck / ckpt.file_name(killed_at)).exists(), "killed mid-save"
    before = ckpt.file_name(killed_at - 2)
    assert ckpt.latest(ck)[0].name == before
    assert not (r.dir / "status.json").exists()
    assert RunDir(r.dir).status() == "lost", "torchdeck runs and the app show a killed run as lost"

    again = {**cfg, "checkpoint": {**cfg["checkpoint"], "resume": "latest", "every_n_steps": 0}}
    r2 = Run(tmp_path, again, name="resumed")
    runs.append(r2)
    assert r2.wait(timeout=120) == 0, r2.output()
    evs = r2.events()
    msg = next(e["message"] for e in evs if e["kind"] == "log" and "resumed from" in e["message"])
    assert f"killed/checkpoints/{before}" in msg and f"step {killed_at - 2}" in msg
    assert min(e["step"] for e in evs if e["kind"] == "step") > killed_at - 2, "no step was redone"
    assert_clean(r2)

    monkeypatch.syspath_prepend(str(tmp_path))
    straight = small_cfg(**{"model.name": "failmodels:heavy", "train.batch_size": 16, "train.max_steps": 12})
    run_in_process(tmp_path / "straight", straight)
    resumed, ref = final_model(r2.dir), final_model(tmp_path / "straight")
    assert resumed["step"] == ref["step"] == 12
    assert_same_weights(resumed["model"], ref["model"])
    assert not (resumed["model"]["1.weight"] == final_model(r.dir)["model"]["1.weight"]).all(), "it trained on"


# ----------------------------------------------------------------------------- a disk that fills up


class LimitedRun(Run):
    """A run whose processes may not write a file beyond `fsize` bytes (ulimit -f, inherited by the
    ranks): writes past it fail with EFBIG as they would with ENOSPC on a full disk. Python ignores
    SIGXFSZ, so the process sees the error instead of dying."""

    def __init__(self, tmp_path: Path, cfg: dict, fsize: int, name="run"):
        import resource
        import subprocess
        from unittest import mock

        real = subprocess.Popen

        def limited(*args, **kw):
            kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            return real(*args, **kw)

        with mock.patch.object(subprocess, "Popen", limited):
            super().__init__(tmp_path, cfg, name=name)


@pytest.mark.slow
def test_events_file_hitting_the_disk_limit_stops_the_run_cleanly(tmp_path, runs):
    """events.jsonl stops growing mid-run: the supervisor stops the run gracefully (rank 0 still
    checkpoints) and fails it with one clear line; nothing written before is lost."""
    from torchdeck.engine import checkpoint as ckpt

    # 128 KiB: a few hundred steps of events, and room for the final checkpoint (~50 KB).
    r = LimitedRun(tmp_path, ddp_cfg(**{"train.max_steps": 0, "train.epochs": 200}), fsize=128 << 10)
    runs.append(r)
    r.wait_for(lambda e: e["kind"] == "step")
    rc = r.wait(timeout=120)
    assert rc == 1, r.output()
    st = r.status()
    assert st["status"] == "failed" and st["exit_codes"] == [0, 0], st
    assert st["root_cause"] == (
        f"cannot write {r.dir / 'events.jsonl'}: File too large: raise the file size limit (ulimit -f); "
        "the run was stopped after a final checkpoint")
    done = (r.dir / "status.json").stat().st_mtime - (r.dir / "events.jsonl").stat().st_mtime
    assert done < 30, "stopped within the 30 s a graceful stop may take"
    evs = r.events()
    assert 200 < (r.dir / "events.jsonl").stat().st_size <= 128 << 10
    last = max(e["step"] for e in evs if e["kind"] == "step")
    path, state = ckpt.latest(r.dir / "checkpoints")  # written after the failure, and complete
    assert state["step"] >= last > 50
    assert "Traceback" not in r.output()
    assert not (r.dir / ".reserve").exists()
    assert_clean(r)


def read_all_events(run: RunDir) -> list[dict]:
    return events.read_all(run.events_path)


def wait_gone(run: RunDir, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while control.run_processes(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not control.run_processes(run), f"left in the run's session: {control.run_processes(run)}"


def _tiny_disk(path: Path, size: str) -> bool:
    """A real file system of `size` (tmpfs) at path; False where mounting is not allowed (not root)."""
    import subprocess

    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tdtest", str(path)],
                       capture_output=True, text=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("every_n, size", [(50, "1m"), (0, "320k")], ids=["checkpoint-fills-it", "events-fill-it"])
def test_a_full_disk_fails_the_run_with_one_message_and_keeps_its_checkpoints(tmp_path, every_n, size):
    """The run directory on a small file system: events and checkpoints fill it mid-run (ENOSPC).
    With no periodic checkpoints, the events file fills it to the last page: the supervisor's
    reserve is what leaves room for status.json. That disk is smaller (320 KiB: a few hundred
    steps of events, not thousands): the steps it takes to fill are the test's CPU."""
    import subprocess

    from torchdeck.engine import checkpoint as ckpt
    from torchdeck.engine import config as cfgmod
    from tests.engine.helpers import small_cfg

    disk = tmp_path / "disk"
    if not _tiny_disk(disk, size):
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN); the RLIMIT_FSIZE test covers the rest")
    try:
        cfg = cfgmod.from_dict(small_cfg(strategy="ddp", devices=2, **{
            "nodes.master_port": 0, "train.batch_size": 8, "train.max_steps": 0, "train.epochs": 500,
            "train.log_every_n_steps": 1, "data.image_size": 16, "checkpoint.every_n_steps": every_n,
            "checkpoint.keep_last": 2}))
        run = control.start(cfg, root=disk)
        t0 = time.monotonic()
        final = control.wait(run, timeout=150)
        assert final is not None, "the run did not end"
        assert time.monotonic() - t0 < 120
        cause = final["root_cause"]
        assert final["status"] == "failed" and "No space left on device" in cause, final
        assert "free space on that disk" in cause and "Traceback" not in cause
        assert run.final_status() == final, "status.json was written on the full disk"
        assert (run.status_path.stat().st_mtime - run.events_path.stat().st_mtime) < 30
        evs = read_all_events(run)
        assert evs[0]["kind"] == "run_started" and sum(e["kind"] == "step" for e in evs) > 100
        if every_n:  # a checkpoint (~200 KB) needs more room than 50 steps of events (~25 KB) take
            path, state = ckpt.latest(run.checkpoint_dir)  # what was written before is intact
            assert state["step"] >= every_n
            assert "cannot write checkpoint" in cause, cause
            assert f"the last complete checkpoint, {path.name}, is intact" in cause, cause
        else:
            assert cause.startswith(f"cannot write {run.events_path}: No space left on device"), cause
        assert not list(run.checkpoint_dir.glob(".*")), "no temp file left"
        wait_gone(run)
        port = evs[0]["master_port"]
        assert port_free(port)
    finally:
        subprocess.run(["umount", "-l", str(disk)])


# ----------------------------------------------------------------------------- bad arguments

TINY = """\
name: tiny
strategy: ddp
devices: 2
model: {name: mlp, hidden: 32}
data: {dataset: synthetic, train_size: 256, val_size: 64, image_size: 16}
train: {batch_size: 32, epochs: 1}
nodes: {master_port: 0}
"""

USER_FILES = {
    "typo_mod.py": "def build(info):\n    return None\n",
    "broken_mod.py": "def build(info:\n    return None\n",
    "needs_mod.py": "import numpy\nimport no_such_dependency_zz\n\ndef build(info):\n    return None\n",
}

BAD_ARGS = [  # (--set, field named, words of the message)
    ("model.name=no_such_pkg_zz.models:net", "model.name", "cannot import 'no_such_pkg_zz.models'"),
    ("model.name=typo_mod:biuld", "model.name", "defines no 'biuld'; did you mean 'typo_mod:build'?"),
    ("model.name=broken_mod:build", "model.name", "broken_mod.py, line 1: syntax error"),
    ("model.name=needs_mod:build", "model.name", "line 2: imports 'no_such_dependency_zz', which cannot be found"),
    ("data.dataset=typo_mod:datasets", "data.dataset", "defines no 'datasets'"),
    ("checkpoint.resume={tmp}/runs/old/checkpoints/ckpt-00000001.pt", "checkpoint.resume",
     "no such checkpoint file"),
    ("checkpoint.resume={tmp}/tiny.yaml", "checkpoint.resume", "is not a PyTorch checkpoint"),
    ("checkpoint.resume={tmp}/cut.pt", "checkpoint.resume", "is not a PyTorch checkpoint"),
    ("data.dataset=imagefolder", "data.root", "no such folder"),
]


def _cut_checkpoint(path: Path) -> None:
    """A real checkpoint cut short, as a copy interrupted halfway leaves it."""
    import torch

    torch.save({"model": {"w": torch.ones(1000)}, "step": 1}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _started_anything(tmp_path: Path) -> list[str]:
    """A run directory, or any process whose command line mentions this test's folder."""
    found = [str(p) for p in (tmp_path / "runs").glob("*")] if (tmp_path / "runs").exists() else []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(tmp_path) in part for part in p.info["cmdline"] or []) and p.pid != os.getpid():
            found.append(f"pid {p.pid}: {' '.join(p.info['cmdline'])}")
    return found


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("override,field,words", BAD_ARGS, ids=[b[0].split("=")[0] + ":" + b[2][:20] for b in BAD_ARGS])
def test_bad_arguments_get_one_line_and_start_nothing(tmp_path, capsys, monkeypatch, command, override, field, words):
    from torchdeck.cli import main as cli

    preset = tmp_path / "tiny.yaml"
    preset.write_text(TINY)
    for name, text in USER_FILES.items():
        (tmp_path / name).write_text(text)
    _cut_checkpoint(tmp_path / "cut.pt")
    monkeypatch.chdir(tmp_path)  # user modules are found from the current directory, as by a run
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    monkeypatch.delitem(__import__("sys").modules, "typo_mod", raising=False)
    extra = ["--set", f"data.root={tmp_path / 'no-data'}"] if "imagefolder" in override else []
    before = _children()
    code = cli.main([command, str(preset), "--set", override.format(tmp=tmp_path), *extra])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    # each bad value came from --set, so --set is blamed, not the preset (issue 35 bug 13)
    assert err.startswith(f"--set: {field}: ") and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in out + err
    assert not _started_anything(tmp_path) and _children() <= before
    assert not any(m in __import__("sys").modules for m in ("typo_mod", "broken_mod", "needs_mod")), \
        "the user's code is checked without being run"


def test_bad_arguments_from_the_real_command_and_debug_shows_the_traceback(tmp_path):
    from tests.cli.test_cli import torchdeck

    preset = tmp_path / "tiny.yaml"
    preset.write_text(TINY)
    (tmp_path / "typo_mod.py").write_text(USER_FILES["typo_mod.py"])
    r = torchdeck("run", str(preset), "--set", "model.name=typo_mod:biuld", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"--set: model.name: typo_mod ({tmp_path / 'typo_mod.py'}) defines no 'biuld'; "
                        "did you mean 'typo_mod:build'?\n")
    assert not _started_anything(tmp_path)
    for args in (["--debug", "validate", str(preset)], ["validate", str(preset), "--debug"]):
        r = torchdeck(*args, "--set", "model.name=typo_mod:biuld", cwd=tmp_path, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("--set: model.name: typo_mod"), args
        assert "Traceback (most recent call last)" in r.stderr and "_config_or_usage" in r.stderr, args


def test_a_valid_user_model_passes_the_static_check(tmp_path, monkeypatch):
    """No false alarms: names bound by imports, assignments, classes, loops and try blocks count."""
    from torchdeck.engine.preflight import callable_problem as _callable_problem

    (tmp_path / "fine_mod.py").write_text(
        "import os\ntry:\n    import optional_zz\nexcept ImportError:\n    optional_zz = None\n"
        "from torchdeck.engine.models import mlp as build_mlp\nfrom torch import nn\n"
        "FACTORY = build_mlp\nfor i in range(2):\n    pass\n"
        "class Net(nn.Module):\n    pass\n\n\ndef build(info):\n    return build_mlp(info, 8)\n")
    (tmp_path / "star_mod.py").write_text("from torchdeck.engine.models import *\n")
    monkeypatch.chdir(tmp_path)
    for name in ("build", "Net", "FACTORY", "build_mlp", "optional_zz", "os"):
        assert _callable_problem(f"fine_mod:{name}") is None, name
    assert _callable_problem("star_mod:mlp") is None  # a star import may define anything
    assert _callable_problem("engine.models:mlp") is None
    assert "defines no 'Nett'" in _callable_problem("fine_mod:Nett")


def test_a_real_checkpoint_passes_the_resume_preflight(tmp_path):
    import torch

    from torchdeck.engine import checkpoint as ckpt
    from torchdeck.engine.preflight import looks_like_checkpoint as _looks_like_checkpoint

    path = ckpt.save({"model": {"w": torch.ones(3)}, "step": 7}, tmp_path, 7, keep_last=1)
    assert _looks_like_checkpoint(path)
    _cut_checkpoint(tmp_path / "cut.pt")
    assert not _looks_like_checkpoint(tmp_path / "cut.pt")


class _Payload:
    """What a hostile checkpoint carries: unpickling it would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_not_run(tmp_path):
    import pickle

    import torch

    from torchdeck.engine import checkpoint as ckpt

    marker = tmp_path / "pwned"
    d = tmp_path / "ck"
    ckpt.save({"model": {"w": torch.ones(2)}, "step": 1}, d, 1, keep_last=5)
    torch.save({"model": {"w": torch.ones(2)}, "step": 2, "x": _Payload(marker)}, d / ckpt.file_name(2))
    with pytest.raises(pickle.UnpicklingError):
        ckpt.load(d / ckpt.file_name(2))
    path, state = ckpt.latest(d)  # resume: latest falls back to the one it can load safely
    assert path.name == ckpt.file_name(1) and state["step"] == 1
    assert not marker.exists(), "weights_only=True: nothing in a checkpoint is executed"
