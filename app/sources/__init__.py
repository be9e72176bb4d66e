"""Live samplers for the app: GPUs through NVML, the host and the run's processes through psutil.

Each source has `status() -> (ok, why_not)` and `sample()`, and a fake twin for tests and
snapshots. They block (NVML calls can take milliseconds each), so call them from a thread
worker, never from the event loop. No torch and no textual here.
"""
