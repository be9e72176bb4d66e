"""How a `torchdeck launch` run ends, through the real CLI with tiny scripts (most import no
torch): a rank that exits non-zero without an exception (its last output quoted), a user's kill
(stopped, not failed; exit 130), two SIGINTs at once (one stop), the user's OMP_NUM_THREADS, and
node 0 of two nodes waiting at a loopback master address (said at start, its wait a phase of
its own)."""
from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time

import pytest

from torchdeck.engine import events
from torchdeck.engine.events import read_all
from torchdeck.engine.runs import control
from torchdeck.engine.runs.view import RunView

from tests.engine.helpers import assert_nothing_left, cli_cmd, env_for, start_cli, the_run, wait_for


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def launch(tmp_path, *args, env=None, timeout=90):
    return subprocess.run(cli_cmd() + ["launch", *args], cwd=tmp_path, env={**env_for(tmp_path), **(env or {})},
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def kinds(run, kind):
    return [e for e in read_all(run.events_path) if e.get("kind") == kind]


# ----------------------------------------------------------------------------- bug 3: no exception, a reason


TYPO = """
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    print("training for", args.epochs, "epochs")
"""

LEGACY = """
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, required=True)  # torch.distributed.launch's scripts
    args = p.parse_args()
"""


@pytest.mark.parametrize("text, args, said", [
    (TYPO, ["--epocs", "2"], "error: unrecognized arguments: --epocs 2"),
    (LEGACY, [], "error: the following arguments are required: --local_rank"),
], ids=["typo", "legacy-local-rank"])
def test_a_rank_exiting_without_an_exception_is_quoted_from_its_log(tmp_path, text, args, said):
    """Before: `root cause: rank 1 exited with code 2` and supervisor.log's tail, while rank0.log
    held argparse's message."""
    write(tmp_path, "train.py", text)
    r = launch(tmp_path, "--nproc-per-node", "2", "train.py", *args)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    cause = next(ln for ln in out.splitlines() if ln.startswith("root cause: "))
    assert "exited with code 2" in cause and said in cause, out
    assert "usage: train.py" in out, out  # the tail under it, as a traceback is shown
    assert "last lines of" not in out, out  # not supervisor.log's tail any more
    assert "master port: free port " in out and "(master_port 0)" in out, out  # bug 15: not an error's wording
    run = the_run(tmp_path)
    final = json.loads(run.status_path.read_text())
    assert final["status"] == "failed" and said in final["root_cause"], final
    (err,) = kinds(run, "error")  # attach, the Monitor and runs read it from the events
    assert err["exception"] == "exit code 2" and said in err["message"] and "usage: train.py" in err["traceback"]
    assert said in kinds(run, "run_finished")[0]["root_cause"]
    shown = subprocess.run(cli_cmd() + ["runs"], cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
                           text=True, timeout=60)
    assert said in shown.stdout, shown.stdout


def test_the_quote_is_the_tail_of_a_huge_log_read_in_bounds(tmp_path):
    from torchdeck.engine.supervisor import TAIL_BYTES, log_tail

    log = tmp_path / "rank0.log"
    log.write_text("x" * (4 * TAIL_BYTES) + "\n" + "".join(f"line {i}\n" for i in range(20)) + "\n\n")
    assert log_tail(log) == [f"line {i}" for i in range(12, 20)]
    log.write_text("y" * (3 * TAIL_BYTES))  # one endless line (a progress bar): the cut line is not quoted
    assert log_tail(log) == []
    assert log_tail(tmp_path / "missing.log") == []


# ----------------------------------------------------------------------------- bug 10: a kill, two SIGINTs


STUBBORN = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a script that does not leave on SIGTERM
    open(f"ready-{os.environ['RANK']}", "w").close()
    while True:
        time.sleep(0.1)
"""

POLITE = """
    import os, sys, signal, time
    def leave(*_):  # a checkpoint that takes a moment: a second stop meanwhile would kill it
        open(f"termed-{os.environ['RANK']}", "a").write("x")
        time.sleep(1.5)
        sys.exit(0)
    signal.signal(signal.SIGTERM, leave)
    open(f"ready-{os.environ['RANK']}", "w").close()
    while True:
        time.sleep(0.1)
"""


def _ready(tmp_path, n=2):
    return all((tmp_path / f"ready-{r}").exists() for r in range(n))


def test_ctrl_c_twice_kills_and_the_run_is_stopped_by_the_user_not_failed(tmp_path, cleanup):
    """Before: status failed, exit 1, `root cause: killed by the user` in red."""
    write(tmp_path, "train.py", STUBBORN)
    proc, log = start_cli(tmp_path, "launch", "--nproc-per-node", "2", "train.py")
    run = the_run(tmp_path)
    cleanup.append(run)
    wait_for(lambda: _ready(tmp_path), 30, "both ranks running")
    pids = [e["pid"] for e in kinds(run, "rank_ready")]
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again to kill" in log.read_text(), 10, "the stop message")
    proc.send_signal(signal.SIGINT)  # a second press, once the first was said
    code = proc.wait(timeout=30)
    out = log.read_text()
    final = json.loads(run.status_path.read_text())
    assert (code, final["status"], final.get("killed")) == (130, "stopped", True), out
    assert "run stopped" in out and "exit code 130" in out, out
    assert "why: killed by the user" in out and "root cause" not in out and "run failed" not in out, out
    assert kinds(run, "run_finished")[-1].get("killed") is True  # the views read it from the events too
    assert_nothing_left(run, pids, 10)


def test_one_ctrl_c_under_timeout_foreground_is_one_stop(tmp_path, cleanup):
    """`timeout --foreground` passes the terminal's Ctrl-C on: the CLI gets the terminal's SIGINT
    (it is in the foreground process group) and timeout's copy; the second killed everything.
    Ctrl-C here is SIGINT to the process group, as the terminal sends it."""
    import os

    write(tmp_path, "train.py", POLITE)
    log = tmp_path / "cli.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(["timeout", "--foreground", "120", *cli_cmd(), "launch", "--nproc-per-node", "2",
                                 "train.py"], cwd=tmp_path, env=env_for(tmp_path), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    run = the_run(tmp_path)
    cleanup.append(run)
    wait_for(lambda: _ready(tmp_path), 30, "both ranks running")
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=30)
    out = log.read_text()
    final = json.loads(run.status_path.read_text())
    assert "killed" not in out and not final.get("killed"), out
    assert (code, final["status"], final["exit_codes"]) == (0, "stopped", [0, 0]), out
    assert (tmp_path / "termed-0").exists() and (tmp_path / "termed-1").exists()  # their SIGTERM handlers ran


def test_a_sigint_before_the_last_one_was_acted_on_is_the_same_keypress():
    """The rule under the test above, called as python calls a handler: a copy that comes before
    the follower acted on the first, or within 0.1 s, counts once; a press after it was said counts."""
    from torchdeck.cli.main import SIGINT_COALESCE_S, _Interrupts

    ints = _Interrupts()
    ints._hit(signal.SIGINT, None)
    ints._hit(signal.SIGINT, None)  # timeout's copy, milliseconds later
    assert ints.count == 1
    ints.handled = 1  # "stopping ...; Ctrl-C again to kill" printed
    ints._hit(signal.SIGINT, None)
    assert ints.count == 1  # still within SIGINT_COALESCE_S of the first
    ints._last -= SIGINT_COALESCE_S
    ints._hit(signal.SIGINT, None)
    assert ints.count == 2


def test_the_supervisor_counts_signals_within_half_a_second_as_one(tmp_path):
    from torchdeck.engine.supervisor import SIGNAL_COALESCE_S, Supervisor

    sup = Supervisor(tmp_path)
    sup.request_stop(signal.SIGTERM, None)
    sup.request_stop(signal.SIGINT, None)
    assert sup.stop_requests == 1
    sup._signal_t -= SIGNAL_COALESCE_S  # as if the first came half a second ago
    sup.request_stop(signal.SIGINT, None)
    assert sup.stop_requests == 2


# ----------------------------------------------------------------------------- OMP_NUM_THREADS, __file__


SAYS = """
    import os, sys
    print("omp", os.environ.get("OMP_NUM_THREADS"))
    print("file", __file__)
"""


@pytest.mark.parametrize("exported, flags, threads", [
    ("3", [], "3"),  # torchrun keeps an exported value
    (None, ["--env", "OMP_NUM_THREADS=1"], "1"),
    ("3", ["--env", "OMP_NUM_THREADS=1"], "1"),  # --env is the user's too, and later
], ids=["exported", "env-flag", "both"])
def test_the_users_omp_num_threads_is_kept_and_said(tmp_path, monkeypatch, exported, flags, threads):
    write(tmp_path, "train.py", SAYS)
    env = {"OMP_NUM_THREADS": exported} if exported else {}
    if not exported:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    r = launch(tmp_path, "--nproc-per-node", "2", *flags, "train.py", env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f", {threads} thread(s) per rank (your OMP_NUM_THREADS)" in out, out
    run = the_run(tmp_path)
    for rank in (0, 1):
        log = run.rank_log(rank).read_text()
        assert f"omp {threads}\n" in log, log
        assert f"file {tmp_path / 'train.py'}\n" in log, log  # absolute, as under torchrun
    assert kinds(run, "run_started")[0]["threads_per_rank"] == int(threads)
    assert {e["threads"] for e in kinds(run, "rank_ready")} == {int(threads)}


def test_a_folder_holding_its_own_torchdeck_py_launches(tmp_path):
    """The shim starts with python -P: without it the working directory comes first on its path
    and this torchdeck.py is imported in place of ours, breaking every `torchdeck launch`."""
    for name in ("torchdeck.py", "engine.py", "yaml.py", "psutil.py"):
        write(tmp_path, name, 'raise SystemExit("user file ran: " + __file__)\n')
    write(tmp_path, "train.py", "print('the script ran')\n")
    r = launch(tmp_path, "--nproc-per-node", "2", "train.py")
    run = the_run(tmp_path)
    logs = [run.rank_log(rank).read_text() for rank in (0, 1)]
    assert r.returncode == 0, r.stdout + r.stderr + "".join(logs)
    assert all("the script ran" in log and "user file ran" not in log for log in logs), logs


# ----------------------------------------------------------------------------- bug 4: two nodes, no address


MEETS = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print("met")
"""


def test_node_0_of_two_at_loopback_says_so_and_names_the_wait(tmp_path, cleanup):
    """Before: nothing said at start, and `ranks importing torch (24 s)` while rank 0 waited in
    the rendezvous for a node that could never come."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write(tmp_path, "train.py", MEETS)
    proc, log = start_cli(tmp_path, "launch", "--nnodes", "2", "--node-rank", "0", "--master-port", str(port),
                          "train.py")
    run = the_run(tmp_path)
    cleanup.append(run)
    try:
        wait_for(lambda: kinds(run, "phase"), 60, "rank 0 at the rendezvous")
        view = RunView()
        view.feed_all(read_all(run.events_path))
        now = time.time()
        assert view.startup(now).startswith("waiting for all 2 nodes to meet (1/2 ranks"), view.startup(now)
        out = log.read_text()
        said = [ln for ln in out.splitlines() if "127.0.0.1 is this host itself" in ln]
        assert said and said[0].startswith("[warning]") and "--master-addr" in said[0], out
        assert out.index(said[0]) < out.index("x1 on node 0"), out  # at the start, before the ranks
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert [e["phase"] for e in kinds(run, "phase")] == ["rendezvous"]


def test_a_scripts_start_up_breaks_down_at_its_rendezvous():
    """The start-up breakdown of a script: python and its imports, the rendezvous (the wait for
    the other ranks and nodes), the script's own set-up; none of it called a torch import."""
    view = RunView()
    for t, ev in [(100.0, events.make("run_started", run="r", world_size=2, num_nodes=2, run_kind="script")),
                  (103.0, events.make("phase", rank=0, phase="rendezvous")),
                  (127.0, events.make("phase", rank=0, phase="script")),
                  (129.5, events.make("step", rank=0, step=1, steps_per_s=None, epoch=None, loss=None))]:
        view.feed({**ev, "t": t})
    assert view.startup_breakdown() == [("python, imports", 3.0), ("rendezvous", 24.0), ("script set-up", 2.5)]
