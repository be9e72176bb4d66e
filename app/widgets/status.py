"""How a run's status is coloured, on every screen (the Monitor's header, the Runs list, Compare)."""
from __future__ import annotations

STATUS_STYLE = {"running": "bold green", "starting": "bold cyan", "finished": "bold green",
                "failed": "bold red", "stopped": "bold yellow", "preempted": "bold yellow", "lost": "bold red",
                # Compare's rows that are not runs (yet): a run skipped, one waiting its turn
                "skipped": "dim", "waiting": "dim"}
