"""The rank side of `torchdeck launch`: the shim run as a real process around small real scripts,
its events read from a real pipe as the supervisor reads them (engine.launch.channel's protocol).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from torchdeck.engine import events
from torchdeck.engine.launch import channel, shim_argv
from torchdeck.engine.rundir import stacks

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


class Launched:
    def __init__(self, proc: subprocess.Popen, read_fd: int):
        self.proc, self.read_fd = proc, read_fd
        self.data = b""
        self.stdout = self.stderr = ""
        self.rc = None

    def drain(self) -> None:
        while chunk := os.read(self.read_fd, 65536):
            self.data += chunk

    @property
    def events(self) -> list[dict]:
        lines = self.data.split(b"\n")
        assert lines[-1] == b"", "an event line without its newline"
        out = []
        for line in lines[:-1]:
            assert len(line) + 1 <= channel.LINE_MAX
            ev = events.parse(line)
            assert ev is not None, line
            out.append(ev)
        return out

    def kinds(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]


def start(args: list[str], cwd: Path, env: dict | None = None, rank: int = 1, module: bool = False,
          **popen) -> Launched:
    r, w = os.pipe()
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    full.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                TORCHDECK_EVENTS_FD=str(w), TORCHDECK_STEP_EVERY_S="0.05", OMP_NUM_THREADS="1")
    full.update(env or {})
    proc = subprocess.Popen(shim_argv(args[0], args[1:], module=module), cwd=cwd, env=full, pass_fds=[w],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    os.close(w)
    return Launched(proc, r)


def finish(run: Launched, timeout: float = 120) -> Launched:
    reader = threading.Thread(target=run.drain, daemon=True)
    reader.start()
    run.stdout, run.stderr = run.proc.communicate(timeout=timeout)
    run.rc = run.proc.returncode
    reader.join(timeout)
    os.close(run.read_fd)
    return run


def launch(args: list[str], cwd: Path, **kw) -> Launched:
    return finish(start(args, cwd, **kw))


def script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


SGD_LOOP = """
    import sys, time
    import torch
    N = int(sys.argv[1])
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, N + 1):
        {before_step}
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        {after_step}
        time.sleep(0.01)
"""


def sgd_script(tmp_path: Path, before_step: str = "pass", after_step: str = "pass", name="train.py") -> Path:
    return script(tmp_path, SGD_LOOP.replace("{before_step}", before_step).replace("{after_step}", after_step), name)


def test_step_hook_counts_optimizer_steps_of_an_unchanged_script(tmp_path):
    path = sgd_script(tmp_path / "proj")
    run = launch([str(path), "25"], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    ready = run.kinds("rank_ready")
    assert len(ready) == 1 and ready[0]["pid"] == run.proc.pid and ready[0]["rank"] == 1
    assert ready[0]["local_rank"] == 1 and ready[0]["threads"] == 1 and ready[0]["v"] == events.EVENT_VERSION
    steps = run.kinds("step")
    assert steps[0]["step"] == 1 and steps[-1]["step"] == 25  # the last one is the exit's flush
    assert [e["step"] for e in steps] == sorted(e["step"] for e in steps)
    assert len(steps) < 25  # throttled to one per TORCHDECK_STEP_EVERY_S
    assert any((e["steps_per_s"] or 0) > 0 for e in steps)
    assert all(e["rank"] == 1 and e["loss"] is None for e in steps)


def test_second_optimizer_is_not_counted_twice(tmp_path):
    path = sgd_script(tmp_path, before_step="opt2 = globals().get('opt2') or torch.optim.Adam(model.parameters())",
                      after_step="opt2.step()")
    run = launch([str(path), "7"], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert run.kinds("step")[-1]["step"] == 7


def test_exception_names_the_users_line_and_exits_1(tmp_path):
    path = sgd_script(tmp_path, before_step="if step == 3: raise ValueError(f'bad batch at step {step}')")
    err_file = tmp_path / "error.json"
    run = launch([str(path), "10"], cwd=tmp_path, env={"TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert run.rc == 1
    line = line_of(path, "raise ValueError")
    (err,) = run.kinds("error")
    assert err["rank"] == 1 and err["pid"] == run.proc.pid and err["host"]
    assert err["exception"] == "ValueError" and err["message"] == "bad batch at step 3"
    tb = err["traceback"]
    assert f'File "{path}", line {line}' in tb and tb.startswith("Traceback (most recent call last):")
    assert "shim.py" not in tb and "runpy" not in tb  # the user's frames only
    assert tb.strip().endswith("ValueError: bad batch at step 3")
    assert tb in run.stderr and "shim.py" not in run.stderr  # printed as python prints it
    assert run.kinds("step")[-1]["step"] == 2  # the steps done, flushed before exiting
    data = json.loads(err_file.read_text())  # torchelastic's error file
    assert data["message"]["message"] == "ValueError: bad batch at step 3"
    assert f'line {line}' in data["message"]["extraInfo"]["py_callstack"]
    assert data["message"]["extraInfo"]["timestamp"].isdigit()


def test_a_huge_traceback_is_cut_to_one_line(tmp_path):
    path = script(tmp_path, """
        def deep(n):
            if n == 0:
                raise RuntimeError("x" * 20000)
            return deep(n - 1)
        deep(300)
    """)
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 1
    (err,) = run.kinds("error")  # parsed: one line of at most 4096 bytes, not split
    assert "characters cut" in err["message"] and "characters cut" in err["traceback"]
    assert err["message"].startswith("xxx") and err["traceback"].startswith("Traceback (most recent call last):")
    assert f'File "{path}", line 6' in err["traceback"]  # the head: the script's outermost line


def test_fit_keeps_every_event_on_one_line():
    ev = {"v": 1, "kind": "step", "t": 1.0, "rank": 0, "metrics": {f"m{i}": 1.5 for i in range(1000)}}
    line = channel.fit(ev)
    assert len(line) < channel.LINE_MAX and json.loads(line)["truncated"] is True
    ev = {"v": 1, "kind": "error", "t": 1.0, "rank": 0, "message": "é" * 5000, "traceback": "ü" * 9000}
    got = json.loads(channel.fit(ev))
    assert len(channel.fit(ev)) < channel.LINE_MAX and got["kind"] == "error" and got["message"].startswith("é")


@pytest.mark.parametrize("code, rc", [("sys.exit(3)", 3), ("sys.exit()", 0), ("sys.exit('no data')", 1),
                                      ("raise KeyboardInterrupt", 130)])
def test_exit_code_is_the_scripts(tmp_path, code, rc):
    path = script(tmp_path, f"import sys\n{code}\n")
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == rc, run.stderr
    assert run.kinds("error") == []  # an exit is not an exception
    if code == "sys.exit('no data')":
        assert "no data" in run.stderr


def test_torchdeck_log_reports_loss_metrics_and_rates(tmp_path):
    path = sgd_script(tmp_path, after_step="torchdeck.log({'loss': loss.detach(), 'lr': 0.01, 'note': 'x'}, samples=32)")
    path.write_text("import torchdeck\n" + path.read_text())
    run = launch([str(path), "12"], cwd=tmp_path, env={"TORCHDECK_LOG_EVERY_S": "0"})  # every call its event
    assert run.rc == 0, run.stderr
    logged = [e for e in run.kinds("step") if "metrics" in e]
    assert [e["step"] for e in logged] == list(range(1, 13))  # the step hook's count
    assert all(isinstance(e["loss"], float) for e in logged)  # a 0-d tensor, read with .item()
    assert all(e["metrics"] == {"lr": 0.01} and e["skipped"] == 1 for e in logged)  # 'note' skipped
    assert logged[0]["samples_per_s"] is None  # nothing to measure from before the first call
    assert all(e["samples_per_s"] > 0 for e in logged[1:])
    assert all(e["tokens_per_s"] is None for e in logged)


def test_torchdeck_log_calls_are_coalesced_into_an_event_every_50_ms(tmp_path):
    """Each event costs the supervisor ~0.3 ms of CPU: a script logging every fast step would take
    a few % of a core from ranks on a busy host (bench launch_vs_torchrun), so log() sends its first
    call, then the newest numbers at most every TORCHDECK_LOG_EVERY_S (0.05 s), with samples/s over
    all the calls since the last event, and what is left at exit."""
    path = script(tmp_path, """
        import time
        import torchdeck
        t = time.monotonic()
        for i in range(1, 401):  # ~0.4 s of 1 ms steps
            torchdeck.log({"loss": float(i)}, step=i, samples=10)
            while time.monotonic() < t + i * 0.001:
                pass
    """)
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    logged = run.kinds("step")
    assert 2 <= len(logged) <= 40, [e["step"] for e in logged]  # not 400
    assert logged[0]["step"] == 1 and logged[-1]["step"] == 400 and logged[-1]["loss"] == 400.0  # exit flushes
    assert [e["step"] for e in logged] == sorted(e["step"] for e in logged)
    rates = [e["samples_per_s"] for e in logged[1:]]
    assert all(r is not None and 2_000 < r < 20_000 for r in rates), rates  # 10 samples per ~1 ms, summed


def test_torchdeck_log_outside_torchdeck_is_free():
    code = textwrap.dedent("""
        import sys, time
        import torchdeck
        assert not any(m.split(".")[0] in ("torch", "yaml") or m.startswith("torchdeck.") for m in sys.modules), sorted(sys.modules)
        assert torchdeck.log({"loss": 1.0}, samples=3) is None
        n = 200000
        t = time.perf_counter()
        for _ in range(n):
            torchdeck.log({"loss": 1.0}, samples=32)
        print(f"{(time.perf_counter() - t) / n * 1e6:.3f}")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    out = subprocess.run([PY, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    print(f"torchdeck.log outside torchdeck: {out.stdout.strip()} us per call")


def test_a_full_pipe_drops_and_counts_never_blocks(tmp_path):
    full, go = tmp_path / "full", tmp_path / "go"
    path = script(tmp_path, f"""
        import os, time
        import torchdeck
        for i in range(3000):  # far more than a pipe holds: writes would block a blocking writer
            torchdeck.log({{"loss": 0.5, "a_long_metric_name": float(i)}}, step=i)
        open({str(full)!r}, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        torchdeck.log({{"loss": 0.25}}, step=3000)
    """)
    run = start([str(path)], cwd=tmp_path, env={"TORCHDECK_LOG_EVERY_S": "0"})  # every call its event
    deadline = time.monotonic() + 60
    while not full.exists():  # nobody reads the pipe meanwhile
        assert run.proc.poll() is None and time.monotonic() < deadline, run.proc.communicate()
        time.sleep(0.02)
    os.set_blocking(run.read_fd, False)
    try:  # empty the pipe, so that the next event fits
        while chunk := os.read(run.read_fd, 65536):
            run.data += chunk
    except BlockingIOError:
        pass
    os.set_blocking(run.read_fd, True)
    go.touch()
    finish(run)
    assert run.rc == 0, run.stderr
    steps = run.kinds("step")
    last = steps[-1]
    assert last["step"] == 3000 and last["dropped"] > 0
    assert len(steps) + sum(e.get("dropped", 0) for e in run.events) == 3001  # every event delivered or counted


def test_module_runs_as_python_m(tmp_path):
    pkg = tmp_path / "mypkg"
    script(pkg, "", "__init__.py")
    script(pkg, "VALUE = 41\n", "helper.py")
    script(pkg, """
        import sys
        from .helper import VALUE
        print("main", __name__, sys.argv, VALUE + 1, sys.path[0])
    """, "train.py")
    run = launch(["mypkg.train", "--epochs", "2"], cwd=tmp_path, module=True)
    assert run.rc == 0, run.stderr
    assert f"main __main__ ['{pkg / 'train.py'}', '--epochs', '2'] 42 {tmp_path}" in run.stdout
    assert run.kinds("rank_ready")


@pytest.mark.parametrize("spelling, flag", [("1", "--local-rank"), ("--local_rank", "--local_rank")])
def test_legacy_local_rank_argument(tmp_path, spelling, flag):
    path = script(tmp_path, """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--lr", type=float)
        p.add_argument("--local-rank", "--local_rank", type=int, dest="local_rank")
        a = p.parse_args()
        print("local rank", a.local_rank, "lr", a.lr)
    """)
    run = launch([str(path), "--lr", "0.5"], cwd=tmp_path, rank=3, env={"TORCHDECK_LOCAL_RANK_ARG": spelling})
    assert run.rc == 0, run.stderr
    assert "local rank 3 lr 0.5" in run.stdout
    plain = launch([str(path)], cwd=tmp_path, rank=3)
    assert "local rank None" in plain.stdout  # without the variable nothing is added
    sys_argv = script(tmp_path, "import sys; print(sys.argv[1:])", "argv.py")
    run = launch([str(sys_argv), "x"], cwd=tmp_path, rank=3, env={"TORCHDECK_LOCAL_RANK_ARG": spelling})
    assert f"['{flag}=3', 'x']" in run.stdout  # before the script's own, as torch.distributed.launch does


def test_a_users_engine_py_runs_from_its_folder(tmp_path):
    script(tmp_path, "def answer():\n    return 42\n", "sibling.py")
    path = script(tmp_path, """
        import sys
        import sibling
        import torchdeck
        torchdeck.log({"loss": 1.0})
        print("engine.py ran", __name__, sibling.answer(), sys.path[0])
    """, "engine.py")
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert f"engine.py ran __main__ 42 {tmp_path}" in run.stdout
    assert [e["loss"] for e in run.kinds("step")] == [1.0]  # torchdeck's own engine, not the script
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = launch([str(path)], cwd=elsewhere)  # the script's folder first, not the working directory's
    assert run.rc == 0, run.stderr
    assert f"engine.py ran __main__ 42 {tmp_path}" in run.stdout


def test_a_script_importing_its_own_engine_module(tmp_path):
    """torchvision's detection references: train.py does `from engine import train_one_epoch`."""
    script(tmp_path, "def train_one_epoch():\n    return 'users engine'\n", "engine.py")
    script(tmp_path, "def main():\n    return 'users app'\n", "app.py")
    path = script(tmp_path, """
        import torchdeck
        from engine import train_one_epoch
        from app import main
        torchdeck.log({"loss": 2.0})
        print(train_one_epoch(), main())
    """)
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert "users engine users app" in run.stdout
    assert [e["loss"] for e in run.kinds("step")] == [2.0]


def test_stacks_of_an_unchanged_script_on_demand(tmp_path):
    ready = tmp_path / "ready"
    path = script(tmp_path, f"""
        import time
        def wait_here():
            open({str(ready)!r}, "w").close()
            time.sleep(60)
        wait_here()
    """)
    dump = tmp_path / "rank1.stacks"
    run = start([str(path)], cwd=tmp_path, env={"TORCHDECK_STACKS_FILE": str(dump)})
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert run.proc.poll() is None and time.monotonic() < deadline, run.proc.communicate()
            time.sleep(0.02)
        (got,) = stacks.collect([("rank 1", 1, run.proc.pid, dump)])
        assert "wait_here (train.py:" in got.where, got.where
    finally:
        run.proc.kill()
        finish(run)


def test_children_report_through_the_rank_pipe(tmp_path):
    """A spawned child (fresh interpreter, the fd not inherited, its number reused for a pipe of
    its own) reaches the rank's pipe through /proc and reports with the RANK it set; a forked
    child shares the fd; nothing is written into the child's pipe that holds the fd's number."""
    other = tmp_path / "user_pipe"
    path = script(tmp_path, f"""
        import multiprocessing as mp, os
        import torchdeck

        def spawned():
            n, pipes = int(os.environ["TORCHDECK_EVENTS_FD"]), []
            while not pipes or max(pipes[-1]) < n:  # until the number is ours: free here
                pipes.append(os.pipe())
            r, w = os.pipe()
            os.dup2(w, n)  # the write end of one of the child's own pipes has the number now
            os.environ["RANK"] = "7"
            torchdeck.log({{"loss": 7.0}})
            os.set_blocking(r, False)
            try:
                got = os.read(r, 65536)
            except BlockingIOError:
                got = b""
            open({str(other)!r}, "wb").write(got)

        def forked():
            torchdeck.log({{"loss": 5.0}})

        if __name__ == "__main__":
            torchdeck.log({{"loss": 1.0}})
            for method, fn in (("spawn", spawned), ("fork", forked)):
                p = mp.get_context(method).Process(target=fn)
                p.start()
                p.join()
                assert p.exitcode == 0
    """)
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert sorted((e["rank"], e["loss"]) for e in run.kinds("step")) == [(1, 1.0), (1, 5.0), (7, 7.0)]
    assert other.read_bytes() == b""


def test_without_the_channel_the_script_just_runs(tmp_path):
    path = sgd_script(tmp_path, after_step="torchdeck.log({'loss': loss})")
    path.write_text("import torchdeck\n" + path.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    out = subprocess.run(shim_argv(str(path), ["3"]), cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_what_the_script_leaves_in_cycles_is_freed_before_the_interpreter_ends(tmp_path):
    """A DDP model and its gloo group, left in a reference cycle by the script, freed by python's
    finalization instead aborted the rank after its last line now and then (SIGABRT, seen in CI on
    the two-node test): the shim collects them while the interpreter is whole."""
    path = script(tmp_path, """
        import sys
        class Holder:
            def __del__(self):
                with open("freed.txt", "w") as fh:
                    fh.write("finalizing" if sys.is_finalizing() else "alive")
        def main():
            h = Holder()
            h.me = h  # a cycle: only the collector frees it
        main()
    """)
    run = launch([str(path)], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert (tmp_path / "freed.txt").read_text() == "alive"


def test_a_relative_script_path_runs_with_an_absolute_file_as_under_torchrun(tmp_path):
    """python 3.9+ makes a script's __file__ absolute, so torchrun's tracebacks name the whole
    path; the shim passed the path as typed to runpy ('File "train.py", line 3')."""
    path = script(tmp_path, """
        import sys
        print("file", __file__, "argv0", sys.argv[0])
        raise ValueError("here")
    """)
    run = launch(["train.py"], cwd=tmp_path)
    assert run.rc == 1, run.stderr
    assert f"file {path} argv0 {path}" in run.stdout  # (runpy makes argv[0] the path it runs)
    (err,) = run.kinds("error")
    assert f'File "{path}", line {line_of(path, "raise ValueError")}' in err["traceback"], err["traceback"]


def test_the_working_directorys_torchdeck_py_does_not_shadow_the_shim(tmp_path):
    """The shim starts with python -P (shim_argv): without it the working directory (a user's
    project folder, where `torchdeck launch` starts the ranks) came first on its path, and a
    torchdeck.py there broke every launch before the script ran."""
    for name in ("torchdeck.py", "yaml.py", "psutil.py"):
        script(tmp_path, 'raise SystemExit("user file ran: " + __file__)\n', name)
    path = script(tmp_path, """
        import torchdeck
        torchdeck.log({"loss": 3.0})
        print("script ran")
    """)
    run = launch([path.name], cwd=tmp_path)
    assert run.rc == 0, run.stderr
    assert "script ran" in run.stdout and "user file ran" not in run.stdout + run.stderr
    assert [e["loss"] for e in run.kinds("step")] == [3.0]  # our torchdeck, not the folder's


def test_init_process_group_is_said_as_the_rendezvous_phase(tmp_path):
    """The wait in init_process_group (on several nodes: for the other nodes) is a phase of its
    own, then the script's set-up: not part of 'importing torch'. `dist.init_process_group`,
    the name scripts call, is the wrapped one."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = script(tmp_path, """
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
        assert dist.init_process_group is distributed_c10d.init_process_group
        dist.init_process_group("gloo", rank=0, world_size=1)
        print("met", dist.get_rank(), dist.init_process_group.__name__)
        dist.destroy_process_group()
    """)
    run = launch([str(path)], cwd=tmp_path, rank=0,
                 env={"WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert run.rc == 0, run.stderr
    assert "met 0 init_process_group" in run.stdout
    assert [e["phase"] for e in run.kinds("phase")] == ["rendezvous", "script", "exiting"]  # exiting: the body returned
