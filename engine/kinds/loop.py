"""torchdeck's own loop: every strategy no other kind claims. Its config sections (model, data,
train, optimizer, checkpoint) are torchdeck's, so everything applies: checkpoint, resume, eval,
a memory estimate; a stop lets the ranks finish their step and rank 0 checkpoint."""
from . import Kind

KIND = Kind("loop", "torchdeck run", default=True)
