"""A strategy is one module (issue 36 item 1): a toy one, written by this test into a copy of the
package tree and nowhere else, appears with its own answers in `torchdeck validate` (its summary,
its refusal), `validate --memory` (its sharding), `torchdeck compare` (accepted, refused by its own
rule), the Configure form's strategy list (its batch-size words, its section) and the Monitor (its
all-reduce timed). Every front end runs in a subprocess with the copy first on the path; a list of
strategy names kept anywhere else leaves the toy out and fails here."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.engine.helpers import copy_of_the_tree, run_in_copy

ROOT = Path(__file__).resolve().parents[2]

TOY = '''\
"""toy-ddp: DDP on CPU ranks that says it splits the optimizer state four ways and wants even batches."""
from .ddp import DDPStrategy


class ToyDDPStrategy(DDPStrategy):
    name = "toy-ddp"
    summary = "a toy DDP, optimizer state in quarters"
    order = 45  # after ddp
    batch_hint = "toy-ddp: per process, an even number"
    compared_by_default = True

    def shards(self, cfg):
        return 1, 1, 4

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.train.batch_size % 2:
            p.append(("train.batch_size", f"toy-ddp halves each batch: give an even size, got {cfg.train.batch_size}"))
        return p


STRATEGY = ToyDDPStrategy()
'''

JOB = """\
name: toyjob
strategy: toy-ddp
accelerator: cpu
devices: 2
backend: gloo
optimizer: {name: adam, lr: 0.001}
model: {name: mlp, hidden: 256}
data: {dataset: synthetic, train_size: 64, val_size: 16, image_size: 16}
train: {batch_size: 8, epochs: 1, threads_per_rank: 1}
"""

# The form and the Monitor, at 80x24, asked what they show for the toy (run with the copy on the path).
APP = """\
import asyncio, html, json, sys, time
from pathlib import Path

from textual.widgets import Select

from torchdeck.app.configure.fields import BY_PATH
from torchdeck.app.main import TorchdeckApp
from torchdeck.app.monitor.panes import no_spread_text
from torchdeck.app.sources.nvml import FakeGPUSource
from torchdeck.engine import events
from torchdeck.engine.runs.view import RunView

tmp = Path(sys.argv[1])
out = {}


async def until(pilot, cond, what, timeout=30):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"{what}: not within {timeout} s")
        await pilot.pause(0.05)


async def main():
    app = TorchdeckApp(preset=str(tmp / "job.yaml"), gpu_source=FakeGPUSource([]), runs_root=tmp / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: getattr(app, "configure_screen", None) is not None
                    and app.configure_screen.form.complete, "the form mounted")
        form = app.configure_screen.form
        select = form.query_one("#f-strategy", Select)
        out["choices"] = [v for _, v in select._options if isinstance(v, str)]
        out["strategy"] = form.value_of("strategy")
        out["batch_hint"] = form.message("train.batch_size")
        out["shown"] = {p: BY_PATH[p].shown(form.value_of) for p in ("backend", "ddp.bucket_cap_mb", "fsdp.state_dict")}
        select.focus()
        await pilot.press("enter")
        await until(pilot, lambda: select.expanded, "the strategy list open")
        out["listed"] = "toy-ddp" in html.unescape(app.export_screenshot())


asyncio.run(main())
st = RunView()  # the Monitor's state of a toy run whose two CPU ranks are up, not yet stepping
st.feed_all([events.make("run_started", run="toyrun", strategy="toy-ddp", world_size=2, nproc_per_node=2,
                         node_rank=0, num_nodes=1, global_batch=16, devices=["cpu", "cpu"],
                         master_addr="127.0.0.1", master_port=29500, pid=1, host="box", total_steps=100)]
            + [events.make("rank_ready", rank=r, local_rank=r, device="cpu", pid=1, host="box", threads=1,
                           cpus=None) for r in (0, 1)])
out["monitor"] = no_spread_text(st)
print("OUT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the package with one file added: engine/strategies/toy_ddp.py."""
    base = copy_of_the_tree(tmp_path_factory.mktemp("toy"), {"engine/strategies/toy_ddp.py": TOY})
    (base / "job.yaml").write_text(JOB)
    return base


def _optimizer_mb(text: str) -> float:
    return float(re.search(r"optimizer state ([\d,.]+)", text).group(1).replace(",", ""))


def test_validate_says_the_toy_its_refusal_and_its_memory(tree):
    code, toy = run_in_copy(tree, "validate", "job.yaml", "--memory")
    assert code == 0, toy
    assert "strategy toy-ddp (a toy DDP, optimizer state in quarters) on cpu, backend gloo" in toy, toy
    n = int(re.search(r"estimated; ([\d,]+) parameters", toy).group(1).replace(",", ""))
    assert n > 200_000 and _optimizer_mb(toy) == round(8 * n / 4 / 2 ** 20, 1), toy  # adam's two moments, in quarters
    code, out = run_in_copy(tree, "validate", "job.yaml", "--set", "train.batch_size=7")
    assert code == 2 and "toy-ddp halves each batch: give an even size, got 7" in out, out
    code, out = run_in_copy(tree, "validate", "job.yaml", "--set", "strategy=toy-dp")
    assert code == 2 and "did you mean 'toy-ddp'?" in out, out


def test_compare_accepts_the_toy_and_skips_it_by_its_own_rule(tree):
    code, out = run_in_copy(tree, "compare", "job.yaml", "--strategies", "toy-ddp,nope", "--steps", "2")
    assert code == 2 and "unknown nope; pick from cpu, gpu, dp, ddp, toy-ddp," in out, out
    # a global batch of 6: each of the toy's 2 ranks would get 3, which it refuses (nothing runs)
    code, out = run_in_copy(tree, "compare", "job.yaml", "--strategies", "toy-ddp", "--steps", "2",
                     "--set", "strategy=cpu", "--set", "devices=1", "--set", "train.batch_size=6")
    assert "toy-ddp: skipped: train.batch_size: toy-ddp halves each batch: give an even size, got 3" in out, out
    code, out = run_in_copy(tree, "compare", "--help")
    assert re.search(r"e\.g\.\s+cpu,ddp,toy-ddp,fsdp,zero", out), out


def test_the_form_lists_it_and_the_monitor_asks_it(tree):
    code, out = run_in_copy(tree, str(tree), code=APP)
    assert code == 0 and "OUT " in out, out
    got = json.loads(out.split("OUT ", 1)[1])
    assert got["choices"][:5] == ["cpu", "gpu", "dp", "ddp", "toy-ddp"], got
    assert got["strategy"] == "toy-ddp" and got["batch_hint"] == "toy-ddp: per process, an even number", got
    assert got["shown"] == {"backend": True, "ddp.bucket_cap_mb": True, "fsdp.state_dict": False}, got
    assert got["listed"], got
    assert got["monitor"] == "rank balance: from the first steps (who waits for whom in the all-reduce)", got


# where a strategy's name may still be written outside engine/strategies: (file, name) -> why
NOT_THE_STRATEGY = {("engine/worker.py", "deepspeed"): "the name of DeepSpeed's launcher that started the rank"}


def test_no_list_or_test_of_strategy_names_outside_the_strategies():
    """The names are written once, in their modules: a comparison with a name (`== "ddp"`, `in
    ("ddp", "zero")`) or a literal list of two or more names anywhere in engine/, app/ or cli/ is a
    list the next strategy would miss. cpu and gpu are accelerator words too, and script is the run
    kind's (tests/test_layers.py guards it): they count only inside a list of names."""
    import ast

    from torchdeck.engine.strategies import names

    known, ambiguous = set(names()), {"cpu", "gpu", "script"}
    bad = []
    for top in ("engine", "app", "cli"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(("engine/strategies/", "engine/kinds/")):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    said = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                            and n.value in known - ambiguous]
                elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    said = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in known]
                    said = said if len(said) >= 2 else []
                else:
                    continue
                bad += [f"{rel}:{node.lineno}: {s!r}" for s in said if (rel, s) not in NOT_THE_STRATEGY]
    assert not bad, "strategy names tested or listed (ask engine.strategies instead):\n" + "\n".join(bad)
