"""DDP with ZeroRedundancyOptimizer: the optimizer state is sharded across ranks."""
from engine.strategies._data_parallel import ProcessGroupStrategy


class ZeroStrategy(ProcessGroupStrategy):
    name = "zero"
    summary = "DDP + ZeroRedundancyOptimizer (optimizer state sharded)"


STRATEGY = ZeroStrategy()
