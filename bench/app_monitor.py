"""The real app showing the Monitor screen of one run: `python -m bench.app_monitor RUN_DIR`."""
from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    from torchdeck.app.main import TorchdeckApp
    from torchdeck.app.monitor.screen import MonitorScreen

    run_dir = Path(sys.argv[1])
    app = TorchdeckApp(runs_root=run_dir.parent)

    async def open_monitor(pilot) -> None:
        await pilot.app.push_screen(MonitorScreen(run_dir))

    app.run(auto_pilot=open_monitor)


if __name__ == "__main__":
    main()
