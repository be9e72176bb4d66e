"""A run whose task has no accuracy (a language model: token cross-entropy, perplexity, tokens/s)
as every text front end shows it: the reducer, `torchdeck run`'s lines, `torchdeck runs`,
`torchdeck compare --target` and `torchdeck eval`'s line. Events are written by hand in the shape
the loop sends (engine/events.py: step metrics and tokens_per_s, epoch_end val_metrics); no run
trains here. A classification run beside it reads as it always did."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchdeck.cli.main import eval_metrics, main
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.errors import UsageError
from torchdeck.engine.runs import compare, progress
from torchdeck.engine.rundir.layout import RunDir
from torchdeck.engine.runs.metric import Target, parse_target
from torchdeck.engine.runs.view import RunView
from tests.run_events import T0, ev, started, step


def lm_events(val_losses=(2.5, 1.9, 2.0), tokens=4096.0, world=2) -> list[dict]:
    """A 2-rank language-model run: steps with tokens/s and an extra metric, no accuracy; three
    epochs whose validation loss falls then rises (its best is not its last)."""
    out = [started(total=30, world=world), ev("log", 0.5, rank=0, level="info",
                                              message="loss: the model's own (output.loss)")]
    t = 1.0
    for e, vl in enumerate(val_losses):
        for s in range(e * 10 + 5, e * 10 + 11, 5):
            for r in range(world):
                out.append(ev("step", t, rank=r, epoch=e, step=s, total_steps=30, loss=vl + 0.3, accuracy=None,
                              samples_per_s=64.0, tokens_per_s=tokens, data_wait_s=0.01, compute_s=0.5, lr=0.1,
                              metrics={"grad_norm": 1.5 - 0.1 * e}, mfu=0.3 + 0.1 * r))
            t += 1.0
        out.append(ev("epoch_end", t, rank=0, epoch=e, step=e * 10 + 10, train_loss=vl + 0.3, train_acc=None,
                      val_loss=vl, val_acc=None, val_metrics={"perplexity": 2.718281828 ** vl},
                      train_metrics={"grad_norm": 1.4}))
        t += 1.0
    return out


def acc_events() -> list[dict]:
    out = [started(total=20)]
    for s, t in ((10, 1.0), (20, 2.0)):
        out += [step(0, s, t), step(1, s, t)]
    out.append(ev("epoch_end", 2.5, rank=0, epoch=0, step=20, train_loss=0.4, train_acc=0.9, val_loss=0.5,
                  val_acc=0.934))
    return out


def test_a_language_model_run_reads_by_its_loss_tokens_and_metrics_in_the_view_and_the_lines():
    view = RunView.replay(lm_events() + [ev("run_finished", 12.0, status="finished", exit_codes=[0, 0],
                                            root_cause=None, elapsed_s=12.0)])
    # the reducer: the main metric is the validation loss (no accuracy anywhere), its best the lowest
    assert view.main_metric() == "val_loss" and view.has_accuracy is False
    assert view.main() == ("val_loss", 2.0, 1.9)
    assert view.loss_rule == "the model's own (output.loss)"
    assert view.tokens_per_s() == pytest.approx(2 * 4096.0)  # over: the ranks' means, added up
    assert view.metrics_now() == {"grad_norm": pytest.approx(1.3)}
    assert [round(v, 2) for _, v in view.step_metrics["grad_norm"].points] == [1.5, 1.5, 1.4, 1.4, 1.3, 1.3]
    assert view.main_text() == "val loss 2.0000 (best 1.9000), perplexity 7.3891"
    epoch_lines = [ln.text for ln in view.logs if ln.text.startswith("epoch ")]
    assert epoch_lines[0] == ("epoch 1 done at step 10: train loss 2.8000 grad norm 1.4000, "
                              "val loss 2.5000 perplexity 12.1825")  # no 'acc -' for a task without one

    # torchdeck run's lines: tokens/s and the loss in the header, tok/s per rank, the summary's best
    head = progress.header(view, T0 + 12, 200)
    assert "mean 8,192 tokens/s | MFU 35%" in head and "val loss 2.0000" in head and "grad norm 1.3" in head
    assert "%" not in head.replace("MFU 35%", "")  # no accuracy, not even a blank one
    assert all("tok/s" in progress.rank_line(view, r, T0 + 12, 120) for r in view.rank_list())
    assert progress.summary(view, T0 + 12)[0] == ("run finished after 00:12; val loss 2.0000 (best 1.9000), "
                                                  "perplexity 7.3891")
    for width in (80, 40):  # still one line each at a narrow terminal
        assert all(len(ln) < width for ln in progress.block(view, T0 + 12, width))

    # a classification run reads as it always did
    acc = RunView.replay(acc_events())
    assert acc.main() == ("val_acc", 0.934, None) and acc.has_accuracy is True and acc.tokens_per_s() is None
    head = progress.header(acc, T0 + 2.5, 200)
    assert head.endswith("| val 93.4%") and "tokens" not in head
    assert [ln.text for ln in acc.logs if ln.text.startswith("epoch ")] == [
        "epoch 1 done at step 20: train loss 0.4000 acc 90.0%, val loss 0.5000 acc 93.4%"]
    assert "tok/s" not in progress.rank_line(acc, acc.ranks[0], T0 + 2.5, 120)


def test_a_scripts_logged_metrics_show_as_the_loops_do():
    """torchdeck.log's numbers arrive as a step event's `metrics`: the same header part."""
    evs = [ev("run_started", 0.0, run="s", strategy="script", world_size=1, run_kind="script",
              command=["python", "train.py"], devices=["cpu"])]
    evs += [ev("step", 1.0 + i, rank=0, step=10 * (i + 1), steps_per_s=5.0, loss=1.0 - 0.1 * i, epoch=None,
               samples_per_s=None, tokens_per_s=None, metrics={"lr": 0.01, "mae": 0.5 - 0.1 * i}) for i in range(3)]
    view = RunView.replay(evs)
    head = progress.header(view, T0 + 3.5, 200)
    assert "lr 0.01  mae 0.3" in head, head
    assert [round(v, 2) for _, v in view.step_metrics["mae"].points] == [0.5, 0.4, 0.3]


def test_targets_parse_as_written_and_say_what_is_wrong_in_one_line():
    assert parse_target("val_acc>=0.9") == Target("val_acc", ">=", 0.9)
    assert parse_target(" val_loss <= 1.6 ") == Target("val_loss", "<=", 1.6)
    assert parse_target("perplexity<5") == Target("perplexity", "<", 5.0)
    assert parse_target("val_acc>=90%") == parse_target(0.9) == parse_target("0.9") == Target("val_acc", ">=", 0.9)
    assert parse_target("val_acc>=0.9").short == "90%" and parse_target("val_loss<=1.6").short == "val_loss<=1.6"
    for bad, says in (("val_loss=1.6", "write METRIC>=VALUE or METRIC<=VALUE"), ("val_acc>=1.5", "between 0 and 1"),
                      ("loss<=1.6%", "percentage is for an accuracy"), ("1.5", "between 0 and 1"),
                      ("val_loss<=x", "write METRIC")):
        with pytest.raises(UsageError) as exc:
            parse_target(bad)
        assert says in str(exc.value) and "\n" not in str(exc.value), (bad, str(exc.value))


def _run_dir(root, name: str, evs: list[dict]) -> RunDir:
    rd = RunDir(root / name)
    rd.path.mkdir(parents=True)
    cfgmod.save(cfgmod.from_dict({"name": name.split("-", 2)[2], "strategy": "ddp", "devices": 2, "backend": "gloo"}),
                rd.config_path)
    rd.events_path.write_text("".join(events.dumps(e) + "\n" for e in evs))
    rd.status_path.write_text(json.dumps({"status": "finished", "exit_codes": [0, 0], "root_cause": None,
                                          "elapsed_s": 12.0}))
    return rd


def test_compare_times_a_lower_is_better_target_and_the_table_says_it(tmp_path, capsys):
    lm = _run_dir(tmp_path, "20260101-000000-lm", lm_events())
    slow = _run_dir(tmp_path, "20260101-000100-slow", lm_events(val_losses=(2.5, 2.2, 2.1)))
    cls = _run_dir(tmp_path, "20260101-000200-cls", acc_events())

    target = parse_target("val_loss<=2.0")
    row = compare.measure(lm.path, None, target)
    assert row.time_to_target_s == pytest.approx(6.0)  # the second epoch ends at 6 s: 1.9 <= 2.0
    assert row.main == "val_loss" and row.final_main == 2.0
    assert row.tokens_per_s == pytest.approx(row.samples_per_s * 4096 / 64)  # tokens per sample at the row's rate
    assert compare.measure(lm.path, None, "perplexity<=7").time_to_target_s == pytest.approx(6.0)  # e^1.9 = 6.7
    rows = compare.of_runs([lm.path, slow.path], target)
    assert rows[1].time_to_target_s is None and rows[1].cells(target)["target"] == "not reached"
    lines = compare.table_lines(rows, target)
    assert lines[0].split() == ["STRATEGY", "STATUS", "WORLD", "GLOBAL", "BATCH", "SAMPLES/S", "TOKENS/S", "VS",
                                "FIRST", "STEP", "DATA", "WAIT", "PEAK", "MEM/RANK", "TO", "val_loss<=2", "VAL", "LOSS"]
    assert lines[1].split()[-2:] == ["00:06", "2.0000"]
    # the plan keeps the text; an old plan's target_acc still reads as val_acc>=X
    facts = {"preset": "p", "name": "p"}
    data = compare.write_plan(tmp_path, facts, [], "val_loss<=2")
    assert data["target"] == "val_loss<=2" and data["target_acc"] is None
    assert compare.write_plan(tmp_path, facts, [], 0.9)["target_acc"] == 0.9
    assert compare.plan_target({"target_acc": 0.6}) == Target("val_acc", ">=", 0.6)
    # classification: the columns as they were
    cls_row = compare.measure(cls.path, None, 0.9)
    assert [label for _, label in compare.columns(0.9, [cls_row])][-2:] == ["TO 90%", "VAL ACC"]
    assert "TOKENS/S" not in [label for _, label in compare.columns(0.9, [cls_row])]
    assert cls_row.cells(0.9)["val"] == "93.4%" and cls_row.time_to_target_s == pytest.approx(2.5)

    # torchdeck runs: the LM runs' column says loss, with the best where it is not the last
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "VAL ACC/LOSS" in out and "2.0000 (best 1.9000)" in out and "93.4%" in out


def test_compare_target_on_the_command_line_bad_text_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "torchdeck.cli", "compare", "quickstart", "--strategies", "cpu",
                        "--target", "val_loss=1.6", "--runs-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    err = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
    assert len(err) == 1 and "--target: 'val_loss=1.6': write METRIC>=VALUE" in err[0], err
    assert not list(tmp_path.iterdir())  # nothing started


def test_eval_prints_the_tasks_metrics():
    assert eval_metrics({"loss": 0.1234, "accuracy": 0.934, "samples": 10}) == ["loss 0.1234", "accuracy 93.40%"]
    assert eval_metrics({"loss": 1.6, "accuracy": None, "metrics": {"perplexity": 4.953}, "samples": 10,
                         "dataset": "text", "step": 3}) == ["loss 1.6000", "perplexity 4.9530"]
