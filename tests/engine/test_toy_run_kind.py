"""A run kind is one module (issue 36 item 2): a toy kind ("notebook": a program exported from a
notebook, run as a user's script is, with reasons of its own), written by this test into a copy of
the package tree beside the toy strategy that is its only strategy, and nowhere else. It answers in
`torchdeck validate --memory`, `compare`, a real `torchdeck run` (its start-up phase, its rank
output), `eval`, `resume` and the Monitor's stop wording: a kind named or listed anywhere else
leaves the toy out (it would be taken for torchdeck's loop) and fails here."""
from __future__ import annotations

import json

import pytest

from tests.engine.helpers import copy_of_the_tree, run_in_copy

KIND = '''\
"""notebook: a program exported from a notebook, run as a user's script is, with its own reasons."""
from . import Kind

KIND = Kind("notebook", "notebook run", strategies=("notebook",),
            no_checkpoint="the notebook keeps its own state", no_resume="run the notebook's cells again",
            no_eval="the notebook evaluates itself", no_memory_estimate="the notebook builds its model as it goes",
            loop_config=False, ranks_from_shim=True, shows_rank_output=True, first_phase="kernel start",
            starting="kernel starting")
'''

STRATEGY = '''\
"""strategy notebook: a notebook's exported program, started as a script is."""
from .script import ScriptStrategy


class NotebookStrategy(ScriptStrategy):
    name = "notebook"
    summary = "a notebook's exported program"
    order = 95


STRATEGY = NotebookStrategy()
'''

CELLS = """\
import torchdeck
for step in range(3):
    torchdeck.log({"loss": 1.0 / (step + 1)})
print("cells done")
"""

JOB = """\
name: nb
strategy: notebook
accelerator: cpu
devices: 1
script: {path: cells.py}
"""

# The Monitor on the toy's finished run, asked how a stop would end it (run with the copy on the path).
APP = """\
import asyncio, json, sys, time
from pathlib import Path

from torchdeck.app.main import TorchdeckApp
from torchdeck.app.monitor.screen import MonitorScreen
from torchdeck.app.sources.nvml import FakeGPUSource

run = Path(sys.argv[1])


async def main():
    app = TorchdeckApp(gpu_source=FakeGPUSource([]), runs_root=run.parent)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = MonitorScreen(run)
        await app.push_screen(screen)
        end = time.monotonic() + 30
        while screen.run_state.run_kind != "notebook" or not screen.run_state.final:
            if time.monotonic() > end:
                raise SystemExit("the run not read within 30 s")
            await pilot.pause(0.05)
        print("OUT " + json.dumps({"stop": screen.stop_wording(), "status": screen.run_state.status}))


asyncio.run(main())
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the package with two files added: engine/kinds/notebook.py and its strategy."""
    base = copy_of_the_tree(tmp_path_factory.mktemp("toykind"), {"engine/kinds/notebook.py": KIND,
                                                                  "engine/strategies/notebook.py": STRATEGY})
    (base / "cells.py").write_text(CELLS)
    (base / "job.yaml").write_text(JOB)
    return base


def test_what_does_not_apply_says_the_toys_own_reasons(tree):
    code, out = run_in_copy(tree, "validate", "job.yaml", "--memory")
    assert code == 2 and "validate --memory does not apply to a notebook run: the notebook builds its model as it goes" in out, out
    code, out = run_in_copy(tree, "compare", "job.yaml", "--strategies", "cpu")
    assert code == 2 and "compare does not apply to a notebook run" in out, out
    code, out = run_in_copy(tree, "validate", "job.yaml")
    assert code == 0 and "strategy notebook: your own script (python cells.py)" in out, out


def test_a_toy_run_runs_as_its_kind_says_and_its_views_ask_it(tree):
    code, out = run_in_copy(tree, "run", "job.yaml")
    assert code == 0, out
    assert "[default0]:cells done" in out, out  # shows_rank_output: the rank's own lines, as torchrun's
    assert "kernel start" in out, out  # first_phase: the start-up breakdown's first part
    run = next((tree / "runs").iterdir())
    started = json.loads((run / "events.jsonl").read_text().splitlines()[0])
    assert started["run_kind"] == "notebook", started
    code, out = run_in_copy(tree, "eval", str(run))
    assert code == 2 and f"eval does not apply to a notebook run ({run.name}): the notebook evaluates itself" in out, out
    code, out = run_in_copy(tree, "resume", str(run))
    assert code == 2 and "resume does not apply to a notebook run" in out and "cells again" in out, out
    code, out = run_in_copy(tree, str(run), code=APP)
    assert code == 0 and "OUT " in out, out
    got = json.loads(out.split("OUT ", 1)[1])
    assert got == {"stop": "ranks get SIGTERM, then SIGKILL after 30 s", "status": "finished"}, got
