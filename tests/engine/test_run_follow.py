"""Following a run from outside (engine.runs.follow): events, log tails, process liveness."""
from __future__ import annotations


def test_worker_output_tail_reads_new_lines_only(tmp_path):
    from torchdeck.engine.runs.follow import FIRST_BYTES, OutputTail
    from torchdeck.engine.runs.layout import RunDir

    (tmp_path / "supervisor.log").write_text("supervisor 1: ddp x2\n")
    (tmp_path / "rank0.log").write_text("x" * (FIRST_BYTES + 10) + "\nold line 1\nold line 2\npart")
    tail = OutputTail(RunDir(tmp_path))
    assert [x[:2] for x in tail.poll()] == [(None, "supervisor 1: ddp x2"), (0, "old line 1"), (0, "old line 2")]
    with open(tmp_path / "rank0.log", "a") as fh:
        fh.write("ial line\n")
    (tmp_path / "rank1.log").write_text("hello from rank 1\n")
    assert [x[:2] for x in tail.poll()] == [(0, "partial line"), (1, "hello from rank 1")]
    assert tail.poll() == []


def test_a_resumed_runs_curves_continue_the_old_ones(tmp_path):
    """The follower of a run resumed from another's checkpoint starts with the old run's curve up
    to that checkpoint (and nothing else of it), then the new run's own points."""
    import json

    from torchdeck.engine import config as cfgmod
    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import Follower
    from torchdeck.engine.runs.layout import RunDir

    def write(rd, evs):
        rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))

    def step(s, loss):
        return events.make("step", rank=0, epoch=0, step=s, total_steps=30, loss=loss, accuracy=0.1 * s,
                           samples_per_s=1.0, data_wait_s=0.0, compute_s=1.0, lr=0.1)

    old = RunDir.create(cfgmod.RunConfig(name="x"), tmp_path)
    write(old, [events.make("run_started", strategy="cpu", world_size=1, total_steps=30)]
          + [step(s, 3.0 - 0.1 * s) for s in range(1, 13)]  # stopped at 12, checkpoint at 10
          + [events.make("epoch_end", rank=0, epoch=0, step=10, train_loss=2.0, train_acc=0.5, val_loss=2.1,
                         val_acc=0.6)])
    new = RunDir.create(cfgmod.RunConfig(name="x"), tmp_path)
    new.origin_path.write_text(json.dumps({"preset": "x", "overrides": [], "resumed_from": str(old.path),
                                           "checkpoint": str(old.checkpoint_dir / "ckpt-00000010.pt")}))
    write(new, [events.make("run_started", strategy="cpu", world_size=1, total_steps=30), step(11, 1.5)])
    f = Follower(new)
    f.poll(force=True)
    xs = [x for x, _ in f.view.steps.points]
    assert xs == list(range(1, 11)) + [11]  # old steps 1-10, not 11-12 (after its checkpoint), then new 11
    assert f.view.steps.points[-1] == (11, 1.5)
    assert f.view.epochs[1].val_acc == 0.6 and f.view.best_val_acc == 0.6
    assert f.view.status == "running" or f.view.status == "starting" or f.view.final  # its own status only
    assert len(f.view.ranks) == 1 and f.view.ranks[0].step == 11


def test_every_reader_of_an_events_file_reads_one_rule(tmp_path):
    """Issue 28: engine.events.read_all parsed lines by a rule of its own, so a line holding JSON
    that is not an object reached its users (torchdeck metrics, tune, stacks, the worker's error
    summary), which call .get on each event. One parser now, the follower's: such a line, an
    empty one and a last line cut mid-write are not events."""
    from torchdeck.engine import events
    from torchdeck.engine.runs.follow import EventTail

    p = tmp_path / "events.jsonl"
    p.write_bytes(b'{"kind":"log","t":1}\n[1]\n"x"\n\n{"kind":"step"')
    assert events.read_all(p) == list(events.iter_events(p)) == [{"kind": "log", "t": 1}]
    tail = EventTail(p)
    assert tail.poll() == [{"kind": "log", "t": 1}] and tail.malformed == 2
