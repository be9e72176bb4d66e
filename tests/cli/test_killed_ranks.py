"""A killed run's ranks (`torchdeck stop --kill`, the Monitor's `k`): SIGKILLed with their supervisor,
no exit of theirs was recorded, so the view kept them running: the Monitor's `seen` age counted up
(`4.4s`, then `06:06`) and the CLI said `steps done: rank 0 237` where a graceful stop says
`(signal SIGTERM)` (issue 35, QA). The view marks them ended (killed) for both front ends."""
from tests.cli.test_held_log_numbers import _wait_for, last_steps, torchdeck
from tests.cli.test_hung_step_count import HANG
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.runs.view import KILLED, RunView
from tests.run_events import ev, started, step


def test_a_killed_runs_ranks_say_killed_in_attach(tmp_path):
    (tmp_path / "train.py").write_text(HANG)
    r = torchdeck("launch", "--detach", "--nproc-per-node", "2", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = (tmp_path / "runs").iterdir()
    run = RunDir(path)
    try:
        _wait_for(lambda: last_steps(run) == {0: 29, 1: 10}, "both ranks' steps", seen=lambda: last_steps(run))
    finally:  # killed whatever happens: a rank left sleeping would outlive the test
        kill = torchdeck("stop", run.name, "--kill", cwd=tmp_path)
    assert kill.returncode == 0, kill.stdout + kill.stderr
    out = torchdeck("attach", run.name, cwd=tmp_path).stdout
    assert "steps done: rank 0 29 (killed), rank 1 10 (killed)" in out, out


def test_the_view_ends_a_killed_runs_ranks_that_said_no_exit():
    view = RunView()
    view.feed_all([started(), step(0, 5, 1.0), step(1, 5, 1.0),
                   ev("rank_exited", 1.5, rank=1, exitcode=-9, signal="SIGKILL")])
    view.feed(ev("run_finished", 2.0, status="stopped", exit_codes=[None, -9], root_cause="killed by the user",
                 elapsed_s=2.0, killed=True))
    r0, r1 = view.rank_list()
    assert (r0.exited, r1.exited) == (KILLED, "signal SIGKILL"), "rule 'a killed run's ranks have ended'"
    assert not view.ended_badly(r0), "the user's kill is no failure of the rank: its figures count"
