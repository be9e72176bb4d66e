"""Configure, walked with valid input to its end (issue 35): a script run typed into the form and
launched, a script preset opened (the command line and Ctrl+O), and every other strategy the form
offers filled validly (the CPU ones launched). The first valid script path used to end the app
(`count(None)` in the summary) behind tests that typed only paths that did not exist."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from torchdeck.engine import config as cfgmod
from torchdeck.engine.rundir.layout import RunDir
from tests.app.screen_helpers import screen_text
from tests.app.test_configure import choose, make_app, ready, two_fake_gpus, type_into

SIZE = (80, 24)

# a script of the seed tutorials' kind, as small as can be: it says what it was given and ends
TRAIN = """\
import os, sys
print("args", sys.argv[1:], "greeting", os.environ.get("GREETING"), "rank", os.environ["RANK"], flush=True)
"""


@pytest.fixture
def presets_dir(tmp_path, monkeypatch):
    d = tmp_path / "presets"
    monkeypatch.setenv("TORCHDECK_PRESETS", str(d))
    return d


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The user's folder, with their train.py, as the working directory (where the app was started)."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    monkeypatch.chdir(work)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # an exported one is kept for the ranks
    return work


def summary_text(screen) -> str:
    return str(screen.query_one("#summary").render())


def command_text(screen) -> str:
    """The headless command under the form (`$ torchdeck run PRESET --set ...`)."""
    return str(screen.query_one("#command").render())


async def paste_into(pilot, wid: str, text: str) -> None:
    """Paste into an empty Input, as a user puts a long path in: one edit, where typing it key by key
    revalidated the form per key (9 s of the module test for one folder)."""
    from textual import events

    w = pilot.app.screen.query_one("#" + wid)
    assert w.value == "", w.value
    w.focus()
    await pilot.pause()
    w.post_message(events.Paste(text))
    await pilot.pause(0.1)


async def wait_for(pilot, cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s; screen:\n{screen_text(pilot.app)}")


async def wait_finished(pilot, app, timeout: float = 90):
    from torchdeck.app.monitor.screen import MonitorScreen

    await wait_for(pilot, lambda: app.last_run is not None and isinstance(app.screen, MonitorScreen), 10,
                   "the Monitor of the new run")
    run = RunDir(app.last_run)
    await wait_for(pilot, lambda: run.final_status() is not None, timeout, f"run {run.name} ended")
    assert run.final_status()["status"] == "finished", (run.final_status(), run.supervisor_log.read_text()[-2000:])
    return run


# ----------------------------------------------------------------------------- a script typed in


@pytest.mark.timeout(120)
async def test_a_valid_script_typed_into_the_form_shows_what_runs_and_f5_runs_it_to_finished(
        tmp_path, presets_dir, project):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "scr")
        await type_into(pilot, "f-script-path", "train.py")
        await type_into(pilot, "f-script-args", "--epochs 2 --name 'a b'")
        await type_into(pilot, "f-script-env", "GREETING=hi")
        await type_into(pilot, "f-devices-procs", "2")
        await pilot.pause(0.2)
        assert app.return_code is None, "the app ended on a valid script path"
        assert screen.cfg is not None and not screen.problems, screen.problems
        said = summary_text(screen)
        # what applies to a script run: its processes, threads and command line; no loop facts
        assert said.startswith("2 processes · world 2 · "), said
        assert "thread" in said and "each rank runs: python train.py --epochs 2 --name 'a b'" in said, said
        assert "global batch" not in said and "data:" not in said, said
        await pilot.press("f5")
        run = await wait_finished(pilot, app)
        launched = run.config()
        assert launched.strategy == "script" and launched.script.args == ["--epochs", "2", "--name", "a b"]
        for rank in (0, 1):
            out = run.rank_log(rank).read_text()
            assert f"args ['--epochs', '2', '--name', 'a b'] greeting hi rank {rank}" in out, out
        await wait_for(pilot, lambda: "FINISHED" in screen_text(app), 10, "the Monitor says FINISHED")


# ----------------------------------------------------------------------------- a script preset

ARGS = ["--lr", "0.1", "--name", "a b", "--quote", "it's", "--empty", ""]


def script_preset(folder: Path, name: str = "myscript") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "description": "my own script", "strategy": "script",
                                    "devices": 2, "script": {"path": "train.py", "args": ARGS,
                                                             "env": {"GREETING": "hello there"}}}))
    return path


@pytest.mark.parametrize("size", [(80, 24), (130, 40)], ids=["80x24", "130x40"])
async def test_a_script_preset_opened_from_the_command_line_shows_its_summary(tmp_path, presets_dir, project, size):
    """`torchdeck app myscript.yaml`: the App given the preset, at both widths (130: the side panel)."""
    preset = script_preset(project)
    app = make_app(tmp_path, preset=str(preset))
    async with app.run_test(size=size) as pilot:
        screen = await ready(pilot)
        assert app.return_code is None and screen.preset_name and screen.cfg is not None, screen.problems
        assert screen.form.to_dict()["script"]["args"] == ARGS
        wide = size[0] >= screen.WIDE
        said = str(screen.query_one("#side-summary" if wide else "#summary").render())
        assert "python train.py --lr 0.1 --name 'a b'" in said and "2 processes" in said, said
        assert "global batch" not in said, said
        if wide:
            assert "environment: GREETING='hello there'" in said and "stop: SIGTERM, SIGKILL after 30 s" in said, said


async def test_a_script_preset_loaded_with_ctrl_o_and_saved_with_ctrl_s_keeps_its_args(tmp_path, presets_dir, project):
    """script.args is a list in YAML and a command line in the form: loading, saving under a new
    name and loading that back gives the same list (quotes, spaces and an empty argument)."""
    script_preset(presets_dir)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        idx = next(i for i, p in enumerate(app.screen.presets) if p.name == "myscript")
        await pilot.press(*["down"] * idx, "enter")
        await wait_for(pilot, lambda: screen.preset_name == "myscript", 10, "the script preset loaded")
        await pilot.pause(0.2)
        assert app.return_code is None and screen.cfg is not None, screen.problems
        assert screen.query_one("#f-script-args").value == "--lr 0.1 --name 'a b' --quote 'it'\"'\"'s' --empty ''"
        assert "each rank runs: python train.py --lr 0.1" in summary_text(screen)
        await pilot.press("ctrl+s")
        await pilot.pause(0.3)
        await pilot.press(*["backspace"] * 20, *"copy", "enter")
        await wait_for(pilot, lambda: (presets_dir / "copy.yaml").exists(), 10, "the copy written")
        assert yaml.safe_load((presets_dir / "copy.yaml").read_text())["script"]["args"] == ARGS
        assert cfgmod.load(presets_dir / "copy.yaml").script.env == {"GREETING": "hello there"}
        # and loaded back into the form: the same list
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        idx = next(i for i, p in enumerate(app.screen.presets) if p.name == "myscript")
        await pilot.press(*["down"] * idx, "enter")
        await wait_for(pilot, lambda: screen.preset_name == "myscript", 10, "myscript again")
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        idx = next(i for i, p in enumerate(app.screen.presets) if p.name == "copy")
        await pilot.press(*["down"] * idx, "enter")
        await wait_for(pilot, lambda: screen.preset_name == "copy", 10, "the copy loaded")
        assert screen.form.to_dict()["script"]["args"] == ARGS and not screen.modified


async def test_switching_to_script_takes_the_scripts_name_and_drops_the_loop_presets_description(
        tmp_path, presets_dir, project):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert screen.form.value_of("name") == "quickstart" and screen.form.value_of("description")
        await choose(pilot, "f-strategy", "scr")
        assert screen.form.value_of("name") == "script" and screen.form.value_of("description") == ""
        # the emptied description is nothing to pass on (it was --set 'description=""')
        await wait_for(pilot, lambda: "strategy=script" in command_text(screen), 5, "the command redrawn")
        assert "description" not in command_text(screen), command_text(screen)
        await type_into(pilot, "f-script-path", "train.py")
        assert screen.form.value_of("name") == "train"  # the file's stem, as torchdeck launch names it
        await type_into(pilot, "f-script-path", "")
        await type_into(pilot, "f-script-module", "pkg.fit")
        assert screen.form.value_of("name") == "fit"
        await choose(pilot, "f-strategy", "dd")  # back to the loop: the preset's own name and words
        assert screen.form.value_of("strategy") == "ddp"
        assert screen.form.value_of("name") == "quickstart" and screen.form.value_of("description")
        await choose(pilot, "f-strategy", "scr")
        assert screen.form.value_of("name") == "fit" and screen.form.value_of("description") == ""
        await type_into(pilot, "f-name", "mine")  # a name the user typed stays
        await type_into(pilot, "f-script-module", "")
        await type_into(pilot, "f-script-path", "train.py")
        assert screen.form.value_of("name") == "mine" and screen.cfg is not None, screen.problems
        await pilot.press("f8")  # the model is the script's: no estimate (it showed quickstart's CNN)
        await pilot.pause(0.2)
        assert app.said("a memory estimate does not apply to a script run: "), app.messages
        assert screen.memory is None
        await pilot.press("f7")  # nor a comparison of torchdeck's strategies
        await pilot.pause(0.2)
        assert app.said("comparing strategies does not apply to a script run: "), app.messages
        assert app.screen is screen
        # what F5 would launch (a typed train.py is launched by the first test: one launch per path)
        assert screen.cfg.name == "mine" and screen.cfg.description == "", screen.cfg
        assert "description" not in command_text(screen), command_text(screen)


def test_an_emptied_description_is_no_override():
    from torchdeck.app.configure.summary import headless_command, overrides

    base = {"name": "quickstart", "description": "CPU quick start", "strategy": "ddp"}
    assert overrides({**base, "description": "", "strategy": "script"}, base) == ["strategy=script"]
    assert headless_command("quickstart", {**base, "description": ""}, base) == "torchdeck run quickstart"
    assert overrides({**base, "description": "mine"}, base) == ["description=mine"]  # a typed one stays


# ----------------------------------------------------------------------------- every field of a script run


PKG_TRAIN = """\
import os, sys
print("module args", sys.argv[1:], "cwd", os.getcwd(), "threads", os.environ["OMP_NUM_THREADS"],
      "rank", os.environ["RANK"], flush=True)
"""


@pytest.mark.timeout(120)
async def test_a_module_run_in_its_own_folder_with_an_old_style_local_rank_launches(tmp_path, presets_dir, project):
    """The script fields a tutorial's train.py does not need, each filled validly and launched:
    -m MODULE, the folder it runs in, --local-rank, the stop grace and threads per rank."""
    other = tmp_path / "elsewhere"
    (other / "pkg").mkdir(parents=True)
    (other / "pkg" / "__init__.py").write_text("")
    (other / "pkg" / "train.py").write_text(PKG_TRAIN)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "scr")
        await paste_into(pilot, "f-script-cwd", str(other))
        await type_into(pilot, "f-script-module", "pkg.train")
        await type_into(pilot, "f-script-args", "--steps 3")
        await type_into(pilot, "f-script-local_rank_arg", "--local-rank")
        await type_into(pilot, "f-script-stop_grace_s", "5")
        await type_into(pilot, "f-train-threads_per_rank", "1")
        await pilot.pause(0.2)
        assert screen.cfg is not None and not screen.problems, screen.problems
        said = summary_text(screen)
        assert "1 thread/rank" in said and "each rank runs: python -m pkg.train --steps 3" in said, said
        await pilot.press("f5")
        run = await wait_finished(pilot, app)
        cfg = run.config()
        assert (cfg.script.module, cfg.script.cwd, cfg.script.stop_grace_s) == ("pkg.train", str(other), 5.0)
        for rank in (0, 1):
            out = run.rank_log(rank).read_text()
            # (where --local-rank goes among the script's own arguments is the launcher's business)
            assert f"--local-rank={rank}'" in out and "'--steps', '3'" in out, out
            assert f"cwd {other} threads 1 rank {rank}" in out, out


@pytest.mark.timeout(120)
async def test_an_executable_run_with_no_python_launches(tmp_path, presets_dir, project):
    exe = project / "train.sh"
    exe.write_text('#!/bin/sh\necho "shell rank $RANK of $WORLD_SIZE: $*"\n')
    exe.chmod(0o755)
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "scr")
        await type_into(pilot, "f-script-path", "./train.sh")
        await type_into(pilot, "f-script-args", "--fast")
        screen.query_one("#f-script-no_python").focus()
        await pilot.press("space")  # the switch, by its key
        await pilot.pause(0.2)
        assert screen.form.value_of("script.no_python") is True
        assert screen.cfg is not None and not screen.problems, screen.problems
        assert "each rank runs: ./train.sh --fast" in summary_text(screen)
        assert screen.form.value_of("name") == "train"
        await pilot.press("f5")
        run = await wait_finished(pilot, app)
        assert "shell rank 1 of 2: --fast" in run.rank_log(1).read_text()


# ----------------------------------------------------------------------------- every other strategy


async def pick_gpus(pilot, strategy: str) -> None:
    """The GPU picker as a user works it: one GPU from the list (gpu), or two ticked (dp)."""
    if strategy == "gpu":
        await choose(pilot, "f-devices-gpu", "G")
        return
    pilot.app.screen.query_one("#f-devices-gpus").focus()
    await pilot.pause(0.1)
    await pilot.press("space", "down", "space")
    await pilot.pause(0.2)


# strategy -> (what to type to pick it, launched here). gpu and dp need GPUs: with the fake GPU list
# they are filled to a valid form and summary, not launched (this machine has no CUDA).
WALK = {"cpu": ("cp", True), "ddp": ("dd", True), "model-parallel": ("mo", False), "fsdp": ("fs", False),
        "zero": ("ze", False), "deepspeed": ("de", False), "gpu": ("gp", False), "dp": ("dp", False)}


def test_the_walk_covers_every_strategy_the_form_offers():
    from torchdeck.app.configure.fields import BY_PATH

    assert set(WALK) | {"script"} == set(BY_PATH["strategy"].choices)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", list(WALK))
async def test_every_strategy_filled_validly_reaches_a_valid_summary_and_the_cpu_ones_launch(
        tmp_path, presets_dir, project, strategy):
    typed, launch = WALK[strategy]
    cuda = strategy in ("gpu", "dp")
    app = make_app(tmp_path, gpus=two_fake_gpus() if cuda else None)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        if strategy != "ddp":  # quickstart is ddp already
            await choose(pilot, "f-strategy", typed)
        assert screen.form.value_of("strategy") == strategy
        if cuda:
            await pick_gpus(pilot, strategy)
        if launch:  # one step and a small validation (typing costs ~1.5 s a field: only where it runs)
            await type_into(pilot, "f-train-max_steps", "1")
            await type_into(pilot, "f-data-val_size", "64")
        await pilot.pause(0.2)
        assert app.return_code is None
        assert screen.cfg is not None and not screen.problems, (strategy, screen.problems)
        said = summary_text(screen)
        assert " · world " in said and "global batch" in said, said
        if not launch:
            return
        await pilot.press("f5")
        run = await wait_finished(pilot, app)
        assert run.config().strategy == strategy


def test_a_script_summarys_threads_are_the_ones_its_ranks_get(monkeypatch):
    """script.env's OMP_NUM_THREADS, else the one exported (kept, as torchrun keeps it), else the plan:
    engine.launch.env.threads_of, which the ranks' environment is built with."""
    from torchdeck.app.configure.summary import describe

    def cfg(env=None):
        return cfgmod.from_dict({"name": "t", "strategy": "script", "devices": 2,
                                 "train": {"threads_per_rank": 4}, "script": {"path": "train.py", "env": env or {}}})

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "· 4 threads/rank ·" in describe(cfg())
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert "· 5 threads/rank ·" in describe(cfg())
    assert "· 3 threads/rank ·" in describe(cfg({"OMP_NUM_THREADS": "3"}))
