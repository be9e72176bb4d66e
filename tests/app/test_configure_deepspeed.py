"""The Configure form with strategy deepspeed: its fields follow the strategy and the stage, a bad
ds_config.json is marked on its field, and a missing deepspeed is said on the strategy field."""
from __future__ import annotations

import json
import sys

from tests.app.test_configure import SIZE, choose, invalid, make_app, presets_dir, ready, type_into  # noqa: F401


async def test_deepspeed_fields_follow_the_strategy_and_the_stage(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        shown = screen.form.is_shown
        assert not shown("deepspeed.stage") and not shown("deepspeed.config")  # quickstart is ddp
        await choose(pilot, "f-strategy", "dee")
        assert screen.cfg.strategy == "deepspeed" and screen.cfg.deepspeed.stage == 2
        for path in ("deepspeed.stage", "deepspeed.offload_optimizer", "deepspeed.overlap_comm",
                     "deepspeed.contiguous_gradients", "deepspeed.config", "backend", "nodes.num_nodes"):
            assert shown(path), path
        assert not shown("deepspeed.offload_param")  # parameters offload under stage 3 only
        assert not shown("ddp.bucket_cap_mb")
        await type_into(pilot, "f-deepspeed-stage", "3")
        assert shown("deepspeed.offload_param")
        await choose(pilot, "f-deepspeed-offload_param", "c")
        assert screen.cfg.deepspeed.offload_param == "cpu" and not screen.problems
        await type_into(pilot, "f-deepspeed-stage", "2")
        assert "needs ZeRO stage 3" in invalid(screen, "deepspeed.offload_param")  # wrong, so still shown
        assert shown("deepspeed.offload_param")


async def test_a_bad_ds_config_is_marked_on_its_field(tmp_path, presets_dir):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "dee")
        await type_into(pilot, "f-deepspeed-config", str(tmp_path / "nope.json"))
        assert "no such file" in invalid(screen, "deepspeed.config")
        (tmp_path / "ds.json").write_text('{"train_batch_size": 31}')  # 2 ranks cannot split it
        await type_into(pilot, "f-deepspeed-config", str(tmp_path / "ds.json"))
        assert "train_batch_size 31 must equal" in invalid(screen, "deepspeed.config")
        (tmp_path / "ok.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
        await type_into(pilot, "f-deepspeed-config", str(tmp_path / "ok.json"))
        assert invalid(screen, "deepspeed.config") is None


async def test_without_deepspeed_the_strategy_field_says_how_to_install_it(tmp_path, presets_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # how Python marks a module it cannot import
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await choose(pilot, "f-strategy", "dee")
        assert invalid(screen, "strategy") == "deepspeed: not installed: pip install 'torchdeck[deepspeed]'"
        # the brackets are shown as typed (not read as markup), under the field and in the summary
        assert "pip install 'torchdeck[deepspeed]'" in str(screen.query_one("#summary").render())
