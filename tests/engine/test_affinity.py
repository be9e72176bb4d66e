"""train.cpu_affinity: each CPU rank on cores of its own (engine/affinity.py), read back from the
ranks' real /proc entries in a supervised run."""
from __future__ import annotations

import json
import os

import pytest

from torchdeck.engine import affinity
from torchdeck.engine.events import read_all
from tests.engine.helpers import run_supervised, small_cfg

CPUS = affinity.allowed_cpus()
need_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs this process may use")


def test_plan_splits_the_allowed_set_in_order_and_says_why_not():
    assert affinity.plan("auto", "cpu", 2, 1, [0, 1]) == ([[0], [1]], "train.cpu_affinity auto")
    assert affinity.plan("auto", "cpu", 2, 2, [4, 5, 6, 7])[0] == [[4, 5], [6, 7]]  # a taskset's set, not 0..
    assert affinity.plan("exclusive", "cuda", 2, 1, [0, 1, 2])[0] == [[0], [1]]
    none, why = affinity.plan("auto", "cpu", 1, 2, [0, 1])
    assert none is None and "one rank" in why
    none, why = affinity.plan("auto", "cuda", 2, 1, [0, 1])
    assert none is None and "CPU runs only" in why
    none, why = affinity.plan("exclusive", "cpu", 3, 1, [0, 1])
    assert none is None and "3 rank(s) x 1 thread(s) = 3 cores" in why and "may use 2" in why
    assert affinity.plan("none", "cpu", 2, 1, [0, 1])[0] is None
    # a threads_per_rank that leaves cores over: auto does not pile every such run onto the first cores
    none, why = affinity.plan("auto", "cpu", 2, 1, [0, 1, 2, 3])
    assert none is None and "2 of 4 cores" in why
    assert affinity.plan("exclusive", "cpu", 2, 1, [0, 1, 2, 3])[0] == [[0], [1]]
    assert affinity.plan("auto", "cpu", 3, 2, list(range(7)))[0] == [[0, 1], [2, 3], [4, 5]]  # 7 // 3 = 2 leaves 1
    assert affinity.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def _fake_sysfs(root, nodes: dict[int, str], topo: dict[int, tuple[int, int]]):
    """A sysfs tree as a host this machine is not (2 sockets, 2 hyperthreads a core) shows it."""
    for node, cpulist in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    for cpu, (pkg, core) in topo.items():
        d = root / "cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
        (d / "core_id").write_text(f"{core}\n")
    return str(root)


def test_ranks_get_whole_cores_on_one_numa_node_of_an_smt_host(tmp_path):
    # Linux's numbering on 2 sockets x 2 cores x 2 threads: first threads 0-3 across both
    # sockets, their siblings 4-7. Split by number, rank 0 had 0-3: one thread of every core of
    # both sockets, and rank 1 the sibling of each of them.
    sysfs = _fake_sysfs(tmp_path, {0: "0-1,4-5", 1: "2-3,6-7"},
                        {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)})
    order = affinity.core_order(list(range(8)), sysfs)
    assert order == [0, 4, 1, 5, 2, 6, 3, 7]
    assert affinity.plan("auto", "cpu", 2, 4, order)[0] == [[0, 4, 1, 5], [2, 6, 3, 7]]  # a socket each
    assert affinity.plan("auto", "cpu", 4, 2, order)[0] == [[0, 4], [1, 5], [2, 6], [3, 7]]  # a core each
    assert affinity.core_order([7, 6, 3, 2], sysfs) == [2, 6, 3, 7]  # a taskset's share of socket 1
    assert affinity.core_order([3, 1, 2], str(tmp_path / "absent")) == [1, 2, 3]  # unknown: number order
    assert sorted(affinity.core_order(affinity.allowed_cpus())) == affinity.allowed_cpus()  # this host's sysfs
    assert affinity.parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def _ddp(tmp_path, mode, **over):
    out = tmp_path / "seen"
    out.mkdir()
    cfg = small_cfg(strategy="ddp", devices=2, **{"model.name": "tests.engine.probes:cores_model",
                                                   "model.kwargs": {"out": str(out)},
                                                   "train.cpu_affinity": mode, "nodes.master_port": 0,
                                                   "train.max_steps": 2, **over})
    proc = run_supervised(tmp_path / "run", cfg)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, read_all(tmp_path / "run" / "events.jsonl")


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    """One auto run serves both auto tests (a whole run is most of their cost): with a loader
    worker a rank, whose cores the worker reports; the rank's own threads are recorded when its
    model is built, as without workers."""
    return _ddp(tmp_path_factory.mktemp("auto"), "auto", **{
        "data.dataset": "tests.engine.probes:cores_data", "data.num_workers": 1,
        "data.persistent_workers": False, "train.batch_size": 8})


@need_two
def test_auto_binds_each_cpu_rank_and_all_its_threads_to_a_core_of_its_own(auto_run):
    out, evs = auto_run
    for rank in (0, 1):
        threads = json.loads((out / f"rank{rank}.json").read_text())
        assert len(threads) > 1  # the gloo and queue threads too, not only the main one
        assert all(t == [CPUS[rank]] for t in threads), (rank, threads)
    ready = {e["rank"]: e for e in evs if e["kind"] == "rank_ready"}
    assert ready[0]["cpus"] == str(CPUS[0]) and ready[1]["cpus"] == str(CPUS[1])
    assert any(e["kind"] == "log" and e["message"].startswith("ranks bound to cores: local rank 0 on")
               for e in evs)


@need_two
def test_none_leaves_the_ranks_where_the_os_puts_them(tmp_path):
    out, evs = _ddp(tmp_path, "none")
    for rank in (0, 1):
        assert all(t == CPUS for t in json.loads((out / f"rank{rank}.json").read_text()))
    assert all(e.get("cpus") is None for e in evs if e["kind"] == "rank_ready")
    assert not any(e["kind"] == "log" and "bound to cores" in e["message"] for e in evs)


@need_two
def test_loader_workers_of_a_bound_rank_get_the_whole_set_back(auto_run):
    out, _ = auto_run
    workers = [json.loads(p.read_text()) for p in out.glob("worker*")]
    assert len(workers) >= 2  # one per rank at least (each rank reads its own shard)
    for seen in workers:
        assert all(t == CPUS for t in seen["threads"]), seen
        assert seen["parent"] == CPUS  # the fork server too: it was started off its rank's cores
    assert json.loads((out / "rank0.json").read_text())[0] == [CPUS[0]]  # while the rank itself is bound


def test_exclusive_that_does_not_fit_is_refused_before_anything_starts():
    from torchdeck.engine.hardware import Hardware
    from torchdeck.engine.preflight import from_dict, validate

    cfg = from_dict(small_cfg(strategy="ddp", devices=len(CPUS) + 1, **{"train.cpu_affinity": "exclusive"}))
    problems = validate(cfg, Hardware(gpu_count=0, cpu_count=len(CPUS)))
    assert [p for p in problems if p[0] == "train.cpu_affinity" and "cores of their own" in p[1]]


@need_two
def test_validate_says_before_launch_which_cores_the_ranks_will_get(tmp_path):
    """The same plan the ranks make, on this host, in `torchdeck validate`'s description."""
    import subprocess

    from tests.engine.helpers import cli_cmd, env_for

    def cores_line(*sets):
        args = [a for s in sets for a in ("--set", s)]
        out = subprocess.run(cli_cmd() + ["validate", "quickstart", "--set", "train.threads_per_rank=1", *args],
                             cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return next(ln.strip() for ln in out.stdout.splitlines() if ln.strip().startswith("cores:"))

    if len(CPUS) == 2:  # quickstart: 2 ranks x 1 thread take both
        assert cores_line() == f"cores: local rank 0 on {CPUS[0]}, local rank 1 on {CPUS[1]} (train.cpu_affinity auto)"
    assert cores_line("train.cpu_affinity=exclusive").startswith(f"cores: local rank 0 on {CPUS[0]}, local rank 1 on")
    assert cores_line("train.cpu_affinity=none") == "cores: not bound (train.cpu_affinity none)"
    assert cores_line("strategy=cpu", "devices=1") == "cores: not bound (one rank per node: nothing to keep apart)"
