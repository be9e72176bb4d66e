"""Helpers the engine tests share: configs, real runs (in process and supervised), weights
compared, the real CLI started as a user starts it, and what a run leaves behind. Fixtures live
in conftest.py."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from torchdeck.engine import checkpoint as ckpt
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.events import read_all
from torchdeck.engine.runs import control
from torchdeck.engine.rundir.layout import RunDir


ROOT = Path(__file__).resolve().parents[2]


def small_cfg(**over) -> dict:
    """A tiny, fast run: mlp on 8x8 synthetic images, plain SGD with momentum, no eval."""
    d = {
        "name": "eq", "strategy": "cpu", "devices": 1,
        "model": {"name": "mlp", "hidden": 32},
        "data": {"train_size": 256, "val_size": 64, "image_size": 8},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "train": {"batch_size": 32, "epochs": 2, "max_steps": 6, "eval_every_epoch": False,
                  "log_every_n_steps": 2, "threads_per_rank": 1},
        "checkpoint": {"every_epoch": False, "keep_last": 20},
    }
    for key, value in over.items():
        node = d
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return d


def run_supervised(run_dir: Path, cfg: dict, timeout: float = 180, env: dict | None = None):
    """The real thing: `python -m torchdeck.engine.supervisor RUN_DIR` in its own process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfgmod.save(cfgmod.from_dict(cfg), run_dir / "config.yaml")
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "torchdeck.engine.supervisor", str(run_dir)], cwd=ROOT,
                          env=full_env, timeout=timeout, capture_output=True, text=True)
    return proc


def run_in_process(run_dir: Path, cfg: dict) -> list[dict]:
    """One process, no spawn: the same worker code the supervisor runs, for quick single-rank checks."""
    from torchdeck.engine.worker import RankJob, train_rank

    out: list[dict] = []
    run_dir.mkdir(parents=True, exist_ok=True)
    c = cfgmod.from_dict(cfg)
    threads = torch.get_num_threads()
    try:
        train_rank(RankJob(c, run_dir, 0, 0, 1), lambda kind, **f: out.append(events.make(kind, rank=0, **f)))
    finally:
        torch.set_num_threads(threads)
    return out


def final_model(run_dir: Path) -> dict:
    found = ckpt.latest(run_dir / "checkpoints")
    assert found is not None, f"no checkpoint in {run_dir}"
    return found[1]


def assert_same_weights(a: dict, b: dict, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max().item())


def assert_trained(state: dict, cfg: dict, tmp: Path):
    """Guard against vacuous equality: the weights moved away from their initial values."""
    init = run_in_process(tmp, {**cfg, "train": {**cfg["train"], "max_steps": 1},
                                "optimizer": {**cfg["optimizer"], "lr": 1e-12}})
    assert init
    start = final_model(tmp)["model"]
    moved = max((state[k] - start[k]).abs().max().item() for k in state)
    assert moved > 1e-3


LONG = """\
name: {name}
strategy: ddp
accelerator: cpu
devices: 2
backend: gloo
model: {{name: mlp, hidden: 32}}
data: {{dataset: synthetic, train_size: 4096, val_size: 256, image_size: 16}}
train: {{batch_size: 16, epochs: {epochs}, max_steps: {max_steps}, log_every_n_steps: 1}}
nodes: {{master_port: {port}}}
"""


def preset(tmp_path, name="life", epochs=100, max_steps=0, port=0):
    p = tmp_path / f"{name}.yaml"
    p.write_text(LONG.format(name=name, epochs=epochs, max_steps=max_steps, port=port))
    return p


def cli_cmd():
    exe = Path(sys.executable).with_name("torchdeck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torchdeck.cli"]


def env_for(tmp_path):
    return dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs"))


def _as_in_a_terminal():
    """SIGHUP as a login shell leaves it: the suite itself may run under nohup, which children inherit."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_cli(tmp_path, *args, log="cli.log"):
    out = open(tmp_path / log, "w")
    proc = subprocess.Popen(cli_cmd() + list(args), cwd=tmp_path, env=env_for(tmp_path),
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_as_in_a_terminal)
    return proc, tmp_path / log


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def the_run(tmp_path) -> RunDir:
    def find():
        root = tmp_path / "runs"
        dirs = [p for p in root.iterdir() if (p / "config.yaml").is_file()] if root.exists() else []
        return dirs[0] if dirs else None
    return RunDir(wait_for(find, 30, "the run directory"))


def steps_seen(run: RunDir, n=3):
    return sum(1 for e in read_all(run.events_path) if e["kind"] == "step") >= n


def rank_pids(run: RunDir):
    return {e["rank"]: e["pid"] for e in read_all(run.events_path) if e["kind"] == "rank_ready"}


def port_of(run: RunDir) -> int:
    return next(e["master_port"] for e in read_all(run.events_path) if e["kind"] == "run_started")


# After a rank is SIGKILLed, every process of the run must be gone within this many seconds (the
# supervisor's own sequence: 2 s for the others to fail, SIGTERM, 2 s, SIGKILL, 2 s). When CI
# once saw it fail, the supervisor had hung at exit for good (fixed in EventWriter.stop), not
# run slow: keep the bound tight.
LEFT_WITHIN_S = 15


def _described(procs) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.status()} ppid {p.ppid()}: {' '.join(p.cmdline())[:160]}")
        except Exception as exc:  # gone meanwhile
            out.append(f"{p.pid}: {type(exc).__name__}")
    return "; ".join(out)


def assert_nothing_left(run: RunDir, pids, within):
    try:
        wait_for(lambda: not control.run_processes(run), within, f"every process of {run.name} to exit")
    except AssertionError as exc:  # say which, so a slow exit can be told from a leak
        raise AssertionError(f"{exc}; still there: {_described(control.run_processes(run))}") from None
    import psutil

    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"rank processes still alive: {alive}"


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Bindable as the next one-node run's store binds it: on loopback, with SO_REUSEADDR, so
    TIME_WAIT leftovers do not count, nor does a gloo socket that happened to get the same port
    number on another address (binding every interface would count it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_holders(port: int) -> list[tuple]:
    """Who has a TCP socket on `port` (address, state, pid): for the message of a failed port check."""
    return [(c.laddr, c.status, c.pid) for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port]


USER_MODELS = '''
import os, time
from torchdeck.engine.models import mlp


def failing(info, at=3, rank="1"):
    """Raises in the forward of its `at`-th training step on one rank."""
    net = mlp(info, 32)
    calls = [0]

    def hook(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank:
                raise RuntimeError(f"boom at step {at}")
    net.register_forward_pre_hook(hook)
    return net


def stall(info, at=5, rank="1", seconds=3600.0):
    """Sleeps in the forward of its `at`-th training step on one rank: for an hour (a hang), or
    for a few seconds (one straggling step, shorter than the stale rule's 10 s)."""
    net = mlp(info, 32)
    calls = [0]

    def stall_here(mod, args):
        if mod.training:
            calls[0] += 1
            if calls[0] == at and os.environ.get("RANK") == rank:
                time.sleep(seconds)
    net.register_forward_pre_hook(stall_here)
    return net


def slow_data(cfg):
    """A data set (module:callable) whose samples take 2 ms each to read on rank 1 only."""
    import torch

    class Slow(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(0)
            self.x, self.y = torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            if os.environ.get("RANK") == "1":
                time.sleep(0.002)
            return self.x[i], self.y[i]
    return Slow(2048), Slow(64), {"num_classes": 10}


def slow(info, sleep=0.05):
    net = mlp(info, 32)
    net.register_forward_pre_hook(lambda mod, args: time.sleep(sleep) if mod.training else None)
    return net
'''


class Run:
    """A supervisor started as a user would: its own process, its own session."""

    def __init__(self, tmp_path: Path, cfg: dict, name="run", stop_grace_s: float | None = None):
        """stop_grace_s: the supervisor's STOP_GRACE_S for this run (a test that waits it out sets a
        short one; the supervisor's code is the same, only the constant it reads differs)."""
        (tmp_path / "usermodels.py").write_text(USER_MODELS)
        self.dir = tmp_path / name
        self.dir.mkdir()
        cfgmod.save(cfgmod.from_dict(cfg), self.dir / "config.yaml")
        env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        start = ["-m", "torchdeck.engine.supervisor", str(self.dir)] if stop_grace_s is None else [
            "-c", "import sys; from torchdeck.engine.supervisor import loop; "
                  f"loop.STOP_GRACE_S = {float(stop_grace_s)!r}; sys.exit(loop.main(sys.argv[1:]))", str(self.dir)]
        self.proc = subprocess.Popen([sys.executable, *start], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True,
                                     # SIGHUP at its default, as from a terminal (the suite may run under nohup),
                                     # so "the supervisor ignores SIGHUP" is the supervisor's doing
                                     preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        self.seen_pids: set[int] = set()

    def events(self) -> list[dict]:
        return events.read_all(self.dir / "events.jsonl")

    def wait_for(self, pred, timeout=120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.note_children()
            for e in self.events():
                if pred(e):
                    return e
            assert self.proc.poll() is None, f"supervisor exited early: {self.output()}"
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting; events: {self.events()[-5:]}")

    def note_children(self) -> None:
        try:
            self.seen_pids.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def wait(self, timeout) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stdout.read()

    def status(self) -> dict:
        return json.loads((self.dir / "status.json").read_text())

    def assert_nothing_left(self, within=5.0) -> None:
        pids = self.seen_pids | {e["pid"] for e in self.events() if e["kind"] == "rank_ready"}
        assert pids, "never saw a rank process"
        deadline = time.monotonic() + within
        alive = pids
        while time.monotonic() < deadline:
            alive = {p for p in pids if _alive(p)}
            if not alive:
                return
            time.sleep(0.1)
        raise AssertionError(f"processes of the run still alive: {alive}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ddp_cfg(**over):
    base = {"strategy": "ddp", "devices": 2, "nodes.master_port": 0, "train.batch_size": 8,
            "train.log_every_n_steps": 1}
    base.update(over)
    return small_cfg(**base)


# ----------------------------------------------------------------------------- a copy of the package tree

def copy_of_the_tree(base: Path, added: dict[str, str]) -> Path:
    """The package (engine, app, cli, presets, torchdeck) copied under base/tree with `added`'s files
    (path under the tree -> text) written in and nothing else changed: a strategy or a run kind that
    is one module is proven so (test_toy_strategy, test_toy_run_kind). Returns base."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    for part in ("engine", "app", "cli", "presets", "torchdeck"):
        shutil.copytree(root / part, base / "tree" / part, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in added.items():
        (base / "tree" / rel).write_text(text)
    return base


def run_in_copy(base: Path, *args, code: str | None = None) -> tuple[int, str]:
    """`torchdeck ARGS` (or `python -c CODE ARGS`) in base with the copied tree first on the path and
    base's runs/ and presets/; (exit code, stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=str(base / "tree"), TORCHDECK_RUNS=str(base / "runs"),
               TORCHDECK_PRESETS=str(base / "presets"), COLUMNS="200")
    env.pop("TORCHDECK_RUN_DIR", None)
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "torchdeck.cli", *args]
    r = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr
