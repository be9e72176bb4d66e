"""GPU samples through NVML: the engine's sampler (engine/sources/nvml.py), re-exported for the
app (the node's supervisor samples with the same code: one sampler, not two)."""
from ...engine.sources.nvml import FakeGPUSource, GPUSample, GPUSource, pid_namespace_warning

__all__ = ["FakeGPUSource", "GPUSample", "GPUSource", "pid_namespace_warning"]
