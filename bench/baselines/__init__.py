"""Hand-written baseline scripts, as a user would write them without torchdeck."""
from __future__ import annotations

import os

# Read by start_ranks; set to fork by bench.common.fork_script (a --quick run).
RANK_START_ENV = "TORCHDECK_BENCH_RANK_START"


def start_ranks(worker, args: tuple, nprocs: int) -> None:
    """mp.spawn(worker, args, nprocs), as the scripts are written. A --quick run forks the script
    from a process that imported torch and sets RANK_START_ENV=fork: its ranks are then forked
    too (torch already imported) instead of each importing torch again, which is most of what a
    tiny run costs."""
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=args, nprocs=nprocs, join=True,
                       start_method=os.environ.get(RANK_START_ENV) or "spawn")
