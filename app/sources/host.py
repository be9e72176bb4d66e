"""Host CPU/RAM and the run's processes through psutil: the engine's sampler
(engine/sources/host.py), re-exported for the app (one sampler, not two)."""
from ...engine.sources.host import FakeHostSource, HostSample, HostSource, ProcSample, descendants

__all__ = ["FakeHostSource", "HostSample", "HostSource", "ProcSample", "descendants"]
