"""DistributedDataParallel: one process per device, gradients all-reduced in buckets."""
from engine.strategies._data_parallel import ProcessGroupStrategy


class DDPStrategy(ProcessGroupStrategy):
    name = "ddp"
    summary = "DistributedDataParallel, one process per device"


STRATEGY = DDPStrategy()
