"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks."""
from engine.strategies._data_parallel import ProcessGroupStrategy


class FSDPStrategy(ProcessGroupStrategy):
    name = "fsdp"
    summary = "FSDP2 fully_shard per block and at the root"


STRATEGY = FSDPStrategy()
