"""Following a run from outside (engine.runs.follow): events, log tails, process liveness."""
from __future__ import annotations


def test_worker_output_tail_reads_new_lines_only(tmp_path):
    from engine.runs.follow import FIRST_BYTES, OutputTail
    from engine.runs.layout import RunDir

    (tmp_path / "supervisor.log").write_text("supervisor 1: ddp x2\n")
    (tmp_path / "rank0.log").write_text("x" * (FIRST_BYTES + 10) + "\nold line 1\nold line 2\npart")
    tail = OutputTail(RunDir(tmp_path))
    assert [x[:2] for x in tail.poll()] == [(None, "supervisor 1: ddp x2"), (0, "old line 1"), (0, "old line 2")]
    with open(tmp_path / "rank0.log", "a") as fh:
        fh.write("ial line\n")
    (tmp_path / "rank1.log").write_text("hello from rank 1\n")
    assert [x[:2] for x in tail.poll()] == [(0, "partial line"), (1, "hello from rank 1")]
    assert tail.poll() == []
