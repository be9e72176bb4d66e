"""python -m bench --only fleet: 32 fake nodes x 8 ranks x 10 events/s for 60 s into a real node 0
(bench/fake_fleet.py): events lost, node 0 supervisor CPU; then, on a second stream of the same
shape, the Monitor's event-to-screen latency and `torchdeck attach`'s redraws/s (bench/fleet_views.py)."""
from bench.fake_fleet import NAME, run, start_fleet  # noqa: F401
