"""How `python -m bench` runs its pieces (issue 36): a quick run shares the benchmarks out between
two lanes and forks the plain scripts from one process that imported torch; a full run does
neither, so its numbers are what they were."""
from __future__ import annotations

import pytest

from bench import __main__ as bench_main
from bench import common as C


def test_lanes_keep_every_benchmark_once_and_the_folder_pair_in_order():
    names = list(bench_main.ORDER)
    got = bench_main.lanes(names, 2)
    assert len(got) == 2 and sorted(n for lane in got for n in lane) == sorted(names)
    (pair,) = [lane for lane in got if "loader_start" in lane]
    assert pair.index("imagefolder_vs_plain") < pair.index("loader_start")  # it reads the PNGs the first wrote
    cost = [sum(bench_main.QUICK_COST.get(n, 5) for n in lane) for lane in got]
    assert max(cost) - min(cost) <= max(bench_main.QUICK_COST.values())  # no lane holds everything
    assert bench_main.lanes(["app", "gpu"], 4) == [["app"], ["gpu"]]


def test_a_full_run_refuses_jobs(capsys):
    with pytest.raises(SystemExit):
        bench_main.main(["--jobs", "2", "--only", "gpu"])
    assert "only with --quick" in capsys.readouterr().err


def test_a_forked_script_reports_as_a_started_one():
    """The plain DDP script forked (its 2 ranks forked from it) prints the same JSON; a forked script
    that fails raises with its own error text."""
    out = C.run_script("bench.baselines.plain_ddp", ["--ranks", "2", "--steps", "4", "--mark-every", "2",
                                                     "--batch-size", "8", "--train-size", "64", "--val-size", "8"],
                       timeout=300, forked=True)
    assert [m[0] for m in out["marks"]] == [2, 4] and out["threads"] >= 1
    assert 0 < out["t_ready"] - out["t_launch"] < out["marks"][0][1] - out["t_launch"]
    with pytest.raises(RuntimeError, match=r"(?s)forked\).*invalid int value: 'x'"):
        C.run_script("bench.baselines.plain_loop", ["--steps", "x"], timeout=120, forked=True)
