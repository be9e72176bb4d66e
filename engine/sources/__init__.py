"""Live samplers of a host: its GPUs through NVML (nvml.py) and its CPU, memory and the run's
processes through psutil (host.py). One implementation for both users: the node's supervisor
samples once a second into node_sample events (engine/nodes), and the app's device picker and
Monitor panes read them directly (app/sources re-exports these).

Each source has `status() -> (ok, why_not)` and `sample()`, and a fake twin for tests and
snapshots. They block (NVML calls can take milliseconds each): call them from a thread, never
from an event loop. No torch and no textual here.
"""
