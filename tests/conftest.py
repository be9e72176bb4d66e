"""The order the suite's files start in, for `make test`'s workers (pytest-xdist, --dist loadfile,
--no-loadscope-reorder).

A worker takes the next file when it is nearly done with its own, so the suite ends when the last
file started ends. xdist's own order (most tests first) puts files of one to four long tests (the
smoke benchmarks, the SLURM cluster, the docs examples) near the end, where one of them can leave
the other worker idle. Longest first, the many short files fill the gaps at the end (simulated on
measured `--durations=0` times: the workers end within 5 s of each other instead of 20-60 s; with 3, within 25 s).
A file missing from LONGEST only starts later, in collection order; tests/test_suite_files.py
checks that each one named exists.
"""
from __future__ import annotations

import os

# The suite runs 3 processes on CI's 2 cores, each starting ranks: by default libgomp's idle threads
# spin a while waiting for the next parallel region, burning a core another test's rank needs (a
# one-process bench run doubled its CPU). Asleep they cost nothing, and no test asserts a speed.
# Set before anything imports torch; ranks and CLIs the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LONGEST = [  # ~seconds each on a quiet 2-core machine, 2026-11-28: 340 to 30
    "tests/app/test_configure.py",
    "tests/engine/test_deepspeed.py",
    "tests/engine/test_failures.py",
    "tests/slurm/test_slurm_cli.py",
    "tests/bench/test_bench_smoke.py",
    "tests/engine/test_multinode.py",
    "tests/app/test_monitor.py",
    "tests/engine/test_integrations.py",
    "tests/app/test_runs.py",
    "tests/engine/test_launch_run.py",
    "tests/engine/test_lifecycle.py",
    "tests/engine/test_supervisor.py",
    "tests/engine/test_network.py",
    "tests/engine/test_tasks.py",
    "tests/cli/test_cli.py",
    "tests/slurm/test_slurm_job.py",
    "tests/app/test_compare_screen.py",
    "tests/test_docs_examples.py",
    "tests/engine/test_stacks.py",
    "tests/engine/test_lm.py",
    "tests/engine/test_launch_shim.py",
    "tests/cli/test_compare.py",
    "tests/engine/test_events_run.py",
    "tests/e2e/test_tmux.py",
    "tests/slurm/test_cluster.py",
    "tests/cli/test_launch.py",
    "tests/engine/test_strategies.py",
    "tests/engine/test_node_link.py",
    "tests/engine/test_rank_memory.py",
    "tests/test_docs_pictures.py",
    "tests/app/test_monitor_80cols.py",
    "tests/engine/test_rank_exit.py",
]


def pytest_collection_modifyitems(session, config, items):
    """Files in LONGEST's order first, the rest after in their own order; tests within a file keep theirs."""
    rank = {path: i for i, path in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST)))
