"""The run kind: one object answers what applies to a run of torchdeck's loop or of the user's script."""
from __future__ import annotations

from torchdeck.engine import config as cfgmod
from torchdeck.engine import kinds as kind


def test_kind_of_config_strategy_and_run_kind_agree():
    cfg = cfgmod.RunConfig()
    assert kind.kind_of(cfg) is kind.loop
    cfg.strategy = "script"
    assert kind.kind_of(cfg) is kind.script
    assert kind.kind_of("script") is kind.script and kind.kind_of("") is kind.loop
    assert kind.kind_of("ddp") is kind.loop and kind.kind_of(None) is kind.loop

    class State:
        run_kind = "script"
    assert kind.kind_of(State()) is kind.script


def test_what_applies_and_why_not():
    assert kind.loop.can_checkpoint and kind.loop.can_resume and kind.loop.can_eval
    assert kind.loop.can_estimate_memory
    s = kind.script
    assert not (s.can_checkpoint or s.can_resume or s.can_eval or s.can_estimate_memory)
    assert all((s.no_checkpoint, s.no_resume, s.no_eval, s.no_memory_estimate))


def test_stop_wording_says_sigterm_for_a_script_and_a_checkpoint_for_the_loop():
    assert kind.loop.stop_wording() == "ranks finish this step, rank 0 checkpoints"
    assert kind.script.stop_wording(12) == "ranks get SIGTERM, then SIGKILL after 12 s"
    assert "checkpoint" not in kind.script.stop_wording()
    assert "script.stop_grace_s" in kind.script.stop_wording()
