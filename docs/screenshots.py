"""The docs' pictures, drawn by the app itself: `python docs/screenshots.py` rewrites docs/images/*.svg.

It drives the app as the snapshot tests do (tests/app/test_snapshots_monitor.py: a recorded
2-rank DDP run with fixed times, a frozen clock, two fake GPUs and a fake host), so a picture
shows what the app draws today, with no GPU and no training. Rerun it when a screen changes.
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "app")]

import test_snapshots_monitor as recorded  # noqa: E402  (the snapshot tests' recorded run)

# name -> (terminal size, what to show); each is one SVG in docs/images
PICTURES = {"monitor": ((140, 45), "monitor")}


async def _draw(size, tmp: Path) -> str:
    from torchdeck.app.main import TorchdeckApp
    from torchdeck.app.sources.host import FakeHostSource
    from torchdeck.app.sources.nvml import FakeGPUSource

    app = TorchdeckApp(gpu_source=FakeGPUSource(recorded.GPUS), host_source=FakeHostSource(recorded.HOST),
                       runs_root=tmp / "runs")
    run_dir = recorded.make_run(tmp)
    async with app.run_test(size=size) as pilot:
        await recorded.show(run_dir)(pilot)
        return app.export_screenshot(title="torchdeck")


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, (size, _what) in PICTURES.items():
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["TORCHDECK_PRESETS"] = str(Path(tmp) / "presets")
            svg = asyncio.run(_draw(size, Path(tmp)))
        path = IMAGES / f"{name}.svg"
        path.write_text(svg, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {size[0]}x{size[1]}, {len(svg):,} bytes")


if __name__ == "__main__":
    main()
