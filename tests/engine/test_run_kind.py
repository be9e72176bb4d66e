"""The run kind: one object answers what applies to a run of torchdeck's loop or of the user's script."""
from __future__ import annotations

from torchdeck.engine import config as cfgmod
from torchdeck.engine import kinds as kind
from torchdeck.engine.kinds import loop as loop_module, script as script_module

LOOP, SCRIPT = loop_module.KIND, script_module.KIND


def test_kind_of_config_strategy_and_run_kind_agree():
    cfg = cfgmod.RunConfig()
    assert kind.kind_of(cfg) is LOOP
    cfg.strategy = "script"
    assert kind.kind_of(cfg) is SCRIPT
    assert kind.kind_of("script") is SCRIPT and kind.kind_of("") is LOOP
    assert kind.kind_of("ddp") is LOOP and kind.kind_of(None) is LOOP

    class State:
        run_kind = "script"
    assert kind.kind_of(State()) is SCRIPT


def test_what_applies_and_why_not():
    assert LOOP.can_checkpoint and LOOP.can_resume and LOOP.can_eval
    assert LOOP.can_estimate_memory
    s = SCRIPT
    assert not (s.can_checkpoint or s.can_resume or s.can_eval or s.can_estimate_memory)
    assert all((s.no_checkpoint, s.no_resume, s.no_eval, s.no_memory_estimate))


def test_stop_wording_says_sigterm_for_a_script_and_a_checkpoint_for_the_loop():
    assert LOOP.stop_wording() == "ranks finish this step, rank 0 checkpoints"
    assert SCRIPT.stop_wording(12) == "ranks get SIGTERM, then SIGKILL after 12 s"
    assert "checkpoint" not in SCRIPT.stop_wording()
    assert "script.stop_grace_s" in SCRIPT.stop_wording()


def test_the_kinds_are_found_from_their_modules_the_default_last():
    """Adding a kind is adding a module to engine/kinds/ (issue 36 item 2): the registry is the
    package, not a list kept elsewhere."""
    assert [k.name for k in kind.kinds()] == ["script", "loop"]
    assert kind.kind_of("loop") is LOOP and kind.kind_of("zero") is LOOP and kind.kind_of("script") is SCRIPT
