"""`torchdeck launch` prints what the script's ranks print, as torchrun does (issue 35, bug 2 and
torchrun's output flags), and its live block leaves nothing stale on Ctrl-C (bug 11). Real scripts
under the real `torchdeck launch`, in a pipe and in a pty; the scripts import no torch (fast)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchdeck.engine.errors import UsageError
from torchdeck.engine.launch import args as launch_args
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.runs.progress import RankOutput
from torchdeck.engine.runs.view import RunView

TORCHDECK = Path(sys.executable).with_name("torchdeck")
ROOT = Path(__file__).parents[2]

# nanoGPT's lines, a warning on stderr, and a last line with no newline
NANO = """\
import os, sys
r = int(os.environ["RANK"])
for it in range(3):
    print(f"iter {it}: loss {1.0 / (it + 1 + r):.4f}, time {12.5 + r:.2f}ms")
print(f"rank {r}: a warning on stderr", file=sys.stderr)
sys.stdout.write(f"rank {r} saved model.pt")
"""


def torchdeck(*args, cwd, timeout=120):
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    env = dict(os.environ, TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(NANO)
    return tmp_path


def _rank_lines(out: str, rank: int) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(f"[default{rank}]:")]


def test_the_ranks_own_output_is_printed_prefixed_as_torchrun_tee_prints_it(project):
    """Under torchrun `iter N: loss X` and `saved model.pt` print where the command was typed; under
    torchdeck launch they were only in rank<N>.log. Now each rank's lines come in a pipe too, in
    their order, prefixed `[default<local rank>]:` (torchrun --tee's), stderr with them; the piped
    status line is short (no command); attach of the finished run shows them again."""
    r = torchdeck("launch", "--nproc-per-node", "2", "train.py", "--lr", "0.1", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert _rank_lines(r.stdout, rank) == [
            f"[default{rank}]:iter {it}: loss {1.0 / (it + 1 + rank):.4f}, time {12.5 + rank:.2f}ms" for it in range(3)
        ] + [f"[default{rank}]:rank {rank}: a warning on stderr", f"[default{rank}]:rank {rank} saved model.pt"], \
            r.stdout
    out = r.stdout.splitlines()
    assert out.index("[default0]:rank 0 saved model.pt") < out.index("run finished")  # before the summary
    status = [ln for ln in out if re.match(r"(STARTING|RUNNING|FINISHED) \|", ln)]
    assert status and all("train.py" not in ln and len(ln) < 100 for ln in status), status
    assert all(ln.startswith(("run started", "supervisor")) for ln in out if "train.py --lr 0.1" in ln), out

    (run,) = (project / "runs").iterdir()
    a = torchdeck("attach", str(run), cwd=project)
    assert a.returncode == 0, a.stderr
    assert "[default1]:iter 2: loss 0.2500, time 13.50ms" in a.stdout, a.stdout


def test_local_ranks_filter_shows_only_rank_1_and_log_dir_holds_the_run(project):
    """torchrun's output flags are taken (both spellings), not refused: --local_ranks_filter=1 shows
    rank 1's lines only (rank 0's still in its log), --tee is accepted, --log-dir DIR puts the run
    directory (and so every rank<N>.log) under DIR."""
    r = torchdeck("launch", "--nproc-per-node", "2", "--local_ranks_filter=1", "--tee", "3", "--log-dir", "logs",
                  "train.py", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _rank_lines(r.stdout, 0), r.stdout
    assert "[default1]:iter 0: loss 0.5000, time 13.50ms" in r.stdout
    (run,) = (project / "logs").iterdir()
    assert not (project / "runs").exists()
    assert "iter 0: loss 1.0000" in (run / "rank0.log").read_text()
    a = torchdeck("attach", str(run), cwd=project)  # attach shows what the launch chose to show
    assert "[default1]:iter 0" in a.stdout and "[default0]:" not in a.stdout, a.stdout


def test_torchdeck_run_of_a_script_preset_prints_the_ranks_output_too(project):
    (project / "mine.yaml").write_text("name: mine\nstrategy: script\ndevices: 2\nscript:\n  path: train.py\n")
    r = torchdeck("run", "mine.yaml", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[default0]:iter 0: loss 1.0000, time 12.50ms" in r.stdout and "[default1]:rank 1 saved model.pt" in r.stdout


def test_redirects_3_keeps_the_output_in_the_files_only(project):
    r = torchdeck("launch", "--nproc-per-node", "2", "-r", "3", "train.py", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[default" not in r.stdout and "iter 0" not in r.stdout, r.stdout
    (run,) = (project / "runs").iterdir()
    assert "iter 2" in (run / "rank1.log").read_text()


# ----------------------------------------------------------------------------- the rules, fast


@pytest.mark.parametrize("argv, shown", [
    ([], [0, 1, 2, 3]),
    (["--local-ranks-filter", "0,2"], [0, 2]),
    (["--local_ranks_filter=3"], [3]),
    (["--redirects", "3"], []),
    (["-r", "1"], []),  # stdout redirected: stderr shares its file, so it goes with it
    (["-r", "2"], [0, 1, 2, 3]),
    (["-r", "0:3,1:1"], [2, 3]),
    (["-r", "3", "--tee", "1"], [0, 1, 2, 3]),  # torchrun: a tee'd stream reaches the console even redirected
    (["-r", "3", "-t", "0:1"], [0]),
    (["--tee", "3", "--local-ranks-filter", "1"], [1]),
])
def test_which_local_ranks_the_terminal_shows(argv, shown):
    rule = launch_args.output_rule(launch_args.parse(argv + ["train.py"]))
    assert [r for r in range(4) if rule.shows(r)] == shown


@pytest.mark.parametrize("argv, said", [
    (["--tee", "4"], "--tee 4: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    (["-r", "0:1,x"], "--redirects 0:1,x: expected"),
    (["--local-ranks-filter", "0,a"], "--local-ranks-filter 0,a: expected local ranks separated by commas"),
])
def test_bad_output_flags_say_what_is_expected(argv, said):
    with pytest.raises(UsageError) as exc:
        launch_args.output_rule(launch_args.parse(argv + ["train.py"]))
    assert said in str(exc.value)


def test_log_dir_and_runs_dir_must_agree(tmp_path):
    ns = launch_args.parse(["--log_dir", str(tmp_path / "a"), "train.py"])
    assert launch_args.runs_dir(ns) == str(tmp_path / "a")
    ns = launch_args.parse(["--log-dir", "a", "--runs-dir", "b", "train.py"])
    with pytest.raises(UsageError, match="--log-dir a and --runs-dir b disagree"):
        launch_args.runs_dir(ns)


def test_rank_output_reads_the_logs_incrementally_in_bounded_reads(tmp_path, monkeypatch):
    """A chatty rank's log is read in pieces (READ_BYTES each), never whole each poll, and every
    line comes out once, in order, prefixed with its local rank on its node."""
    from torchdeck.engine.runs import follow

    monkeypatch.setattr(follow, "READ_BYTES", 1000)
    rd = RunDir(tmp_path)
    view = RunView()
    view.run_kind, view.world_size, view.num_nodes, view.node_rank = "script", 4, 2, 1  # ranks 2, 3 here
    out = RankOutput(rd)
    assert out.poll(view) == []
    with open(rd.rank_log(3), "a") as f:
        f.write("".join(f"line {i}\n" for i in range(5000)))
        f.flush()
        got = out.poll(view)
        assert 0 < len(got) < 5000 and out.tail.behind  # ROUNDS reads of 1000 bytes, not the whole file
        got += out.drain(view)
        f.write("half a line")
        f.flush()
        got += out.poll(view)
        assert got == [f"[default1]:line {i}" for i in range(5000)]
        assert out.drain(view) == ["[default1]:half a line"]
        f.write("\n\r 0%|  | 0/2\r 50%|# | 1/2\r100%|##| 2/2\n")  # a tqdm bar's line: its last state
        f.flush()
        assert out.poll(view) == ["[default1]:100%|##| 2/2"]


def test_attach_to_a_live_run_shows_each_ranks_last_lines_then_the_new_ones(project):
    """attach of a running script: the last 20 lines of each rank (said so), then each new line as
    it is printed; Ctrl-C detaches and the run goes on."""
    (project / "loop.py").write_text(LOOP.replace("0.3", "0.05"))
    r = torchdeck("launch", "--nproc-per-node", "2", "--detach", "loop.py", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = (project / "runs").iterdir()
    cmd = [str(TORCHDECK)] if TORCHDECK.exists() else [sys.executable, "-m", "torchdeck.cli"]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (run / "rank1.log").read_text().count("\n") < 30 \
                if (run / "rank1.log").exists() else True:
            time.sleep(0.1)
        before = (run / "rank1.log").read_text().count("\n")
        p = subprocess.Popen(cmd + ["attach", str(run)], cwd=project, stdout=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, env=dict(os.environ, TORCHDECK_RUNS=str(project / "runs")))
        seen = []
        try:
            for line in p.stdout:
                seen.append(line.rstrip("\n"))
                m = re.match(r"\[default1\]:iter (\d+)", seen[-1])
                if m and int(m.group(1)) >= before + 60:  # 3 s of lines after the wait: live ones
                    break
            p.send_signal(signal.SIGINT)
            rest, _ = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        ones = [int(re.match(r"\[default1\]:iter (\d+)", ln).group(1)) for ln in seen if ln.startswith("[default1]:")]
        assert ones[0] >= before - 20 and ones == list(range(ones[0], ones[-1] + 1)), seen  # its tail, none lost
        assert seen[1].startswith("(the last 20 lines of each rank's output; all of it in"), "\n".join(seen)
        assert "detached; the run goes on" in rest
    finally:
        torchdeck("stop", "--kill", str(run), cwd=project)


# ----------------------------------------------------------------------------- a real terminal


LOOP = """\
import os, time
r = int(os.environ["RANK"])
i = 0
while True:
    print(f"iter {i}: rank {r}", flush=True)
    i += 1
    time.sleep(0.3)
"""

BLOCK = re.compile(r"^(STARTING|RUNNING|STOPPING|STOPPED|FINISHED|FAILED) \||^rank  \d  step")


def test_ctrl_c_leaves_no_stale_line_of_the_live_block(project):
    """On the first Ctrl-C the old `RUNNING ...` and `rank 0` lines stayed above `stop requested`
    (a print under a block drawn with hand-written cursor moves). In a real 80-column pty: the
    ranks' lines and the stop messages above, the block once, at the bottom, after the run stopped."""
    from bench.ptyterm import PtyProcess, Screen

    (project / "loop.py").write_text(LOOP)
    cols, rows = 80, 60
    env = dict(os.environ, TORCHDECK_RUNS=str(project / "runs"))
    p = PtyProcess([str(TORCHDECK), "launch", "--nproc-per-node", "2", "loop.py"], env, cols=cols, rows=rows,
                   cwd=str(project))
    screen = Screen(cols, rows)

    def until(cond, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = p.read(0.2)
            if got is not None:
                screen.feed(got[1])
            if cond():
                return True
            if got is None and p.proc.poll() is not None:
                return cond()
        return False

    try:
        shown = lambda: [ln.rstrip() for ln in screen.text() if ln.strip()]  # noqa: E731
        logs = lambda: "".join(p.read_text() for p in (project / "runs").glob("*/rank1.log"))  # noqa: E731
        assert until(lambda: "iter 2" in logs() and any(ln.startswith("rank  1") for ln in shown()), 60), \
            "\n".join(shown())
        os.killpg(p.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process group
        assert until(lambda: p.proc.poll() is not None, 60), "\n".join(shown())
        until(lambda: False, 0.5)  # the last bytes
    finally:
        p.close()
        for run in (project / "runs").glob("*"):  # the supervisor has a session of its own: a failed wait leaves it
            torchdeck("stop", "--kill", str(run), cwd=project)
    lines = shown()
    block = [i for i, ln in enumerate(lines) if BLOCK.match(ln)]
    assert [lines[i][:7] for i in block] == ["STOPPED", "rank  0", "rank  1"], "\n".join(lines)
    assert any(ln.startswith("stopping: SIGTERM") for ln in lines[:block[0]]), "\n".join(lines)
    assert lines[block[-1] + 1].startswith("run stopped after"), "\n".join(lines)
    assert any(ln.startswith("[default0]:iter 1: rank 0") for ln in lines[:block[0]]), "\n".join(lines)


def test_log_line_prefix_template_as_torchrun_takes_it(tmp_path, monkeypatch):
    """--log-line-prefix-template (and torchrun's environment variable for it) sets the prefix:
    ${role_name}, ${local_rank}, ${rank}, ${hostname}, as torchrun substitutes them."""
    rd = RunDir(tmp_path)
    view = RunView()
    view.run_kind, view.world_size, view.num_nodes, view.node_rank = "script", 4, 2, 1
    rd.rank_log(3).write_text("hello\n")
    rule = launch_args.output_rule(launch_args.parse(["--log-line-prefix-template", "${hostname}:${rank}: ",
                                                      "train.py"]))
    assert RankOutput(rd, rule).poll(view) == [f"{socket.gethostname()}:3: hello"]
    monkeypatch.setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${role_name}/${local_rank}> ")
    rule = launch_args.output_rule(launch_args.parse(["train.py"]))
    assert RankOutput(rd, rule).poll(view) == ["<default/1> hello"]
