"""A model for tests that records what the engine's own training step hands it.

`model.name: tests.engine.probes:recording` builds the cnn (or, with kwargs base: mlp, the mlp)
unchanged: same weights, same numbers. Each forward appends one entry to SEEN: the batch's device,
dtype and memory format, the weights' memory format, whether autocast was on, the process group's
backend, and the dtypes the first layer and the whole model put out. SEEN lives in the process
that trains, so only in-process runs (run_in_process, a Trainer built in the test's own process or
rank) can read it.
"""
from __future__ import annotations

import os

import torch

from torchdeck.engine.models import cnn, mlp

SEEN: list[dict] = []


def _channels_last(t: torch.Tensor) -> bool:
    """Laid out channels-last, not merely compatible with it (a C=1 tensor is both)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def recording(info, base: str = "cnn", hidden: int = 32) -> torch.nn.Module:
    net = cnn(info) if base == "cnn" else mlp(info, hidden)
    first = next(m for m in net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))

    def before(mod, args):
        import torch.distributed as dist

        x = args[0]
        SEEN.append({"training": mod.training, "device": x.device.type, "input_dtype": x.dtype,
                     "input_channels_last": _channels_last(x),
                     "weights_channels_last": _channels_last(first.weight),
                     "autocast": torch.is_autocast_enabled(x.device.type),
                     "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None})

    def first_out(mod, args, out):
        SEEN[-1]["first_layer_dtype"] = out.dtype

    def after(mod, args, out):
        SEEN[-1]["output_dtype"] = out.dtype

    net.register_forward_pre_hook(before)
    first.register_forward_hook(first_out)
    net.register_forward_hook(after)
    return net


def pointwise(info) -> torch.nn.Module:
    """ResNet's parts in small: a 3x3 conv, BatchNorm (running statistics are buffers) and a 1x1
    conv, whose channels_last weight has a last stride of C while is_contiguous() says True."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(info.in_channels, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, info.num_classes))


# ----------------------------------------------------------------------------- cores (train.cpu_affinity)


def _allowed(status: str) -> list[int] | None:
    """The CPUs a /proc status file says its process or thread may run on (None: it is gone)."""
    from torchdeck.engine.affinity import parse_list

    try:
        with open(status) as fh:
            line = next(x for x in fh.read().splitlines() if x.startswith("Cpus_allowed_list:"))
    except OSError:
        return None
    return parse_list(line.split(":", 1)[1])


def _cores_of_every_thread() -> list[list[int]]:
    """The CPUs each thread of this process may run on, read from /proc (not what we asked for)."""
    cores = (_allowed(f"/proc/self/task/{tid}/status") for tid in sorted(os.listdir("/proc/self/task")))
    return [c for c in cores if c is not None]


def cores_model(info, out: str) -> torch.nn.Module:
    """The mlp; on construction (in the rank, after its process group formed) writes the cores of
    each of the rank's threads to OUT/rank<RANK>.json."""
    import json
    import os

    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as fh:
        json.dump(_cores_of_every_thread(), fh)
    return mlp(info, 16)


class _WorkerSet(torch.utils.data.Dataset):
    """Synthetic-sized samples; each loader worker writes OUT/<prefix><pid> once, what `say()`
    (a module-level function: it travels to spawned workers by name) returns there."""

    def __init__(self, out: str, prefix: str, say, n: int = 64):
        self.out, self.prefix, self.say, self.n = out, prefix, say, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        path = os.path.join(self.out, f"{self.prefix}{os.getpid()}")
        if torch.utils.data.get_worker_info() is not None and not os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(self.say())
        return torch.zeros(3, 8, 8), i % 2


_INFO = {"in_channels": 3, "num_classes": 2, "image_size": 8}


def _cores_json() -> str:
    """The worker's threads' cores, and its parent's (the rank, or the fork server it came from)."""
    import json

    return json.dumps({"threads": _cores_of_every_thread(), "parent": _allowed(f"/proc/{os.getppid()}/status")})


def cores_data(cfg):
    """Each loader worker records its threads' cores in OUT/worker<pid>."""
    return _WorkerSet(cfg.model.kwargs["out"], "worker", _cores_json), None, _INFO


# ----------------------------------------------------------------------------- page faults (malloc)


def faults_model(info, out: str, mb: int = 40, rounds: int = 12) -> torch.nn.Module:
    """The mlp; on construction (in the rank) allocates, fills and frees a MB-sized tensor ROUNDS
    times, and writes the minor page faults each round cost to OUT/faults<RANK>.json: a buffer
    glibc gives back at free is faulted in page by page again the next round."""
    import json
    import os
    import resource

    # this thread's faults only: the rank's other threads (its reporter, a loader starting) fault
    # pages of their own meanwhile, and once in a fresh-clone CI run a round counted 40 MiB of them
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    per_round = []
    for _ in range(rounds):
        before = resource.getrusage(who).ru_minflt
        t = torch.empty(mb << 18, dtype=torch.float32).fill_(1.0)  # mb MiB
        del t
        per_round.append(resource.getrusage(who).ru_minflt - before)
    with open(os.path.join(out, f"faults{os.environ.get('RANK', '0')}.json"), "w") as fh:
        json.dump(per_round, fh)
    return mlp(info, 16)


# ----------------------------------------------------------------------------- loader worker start

_BUILT_IN: int | None = None  # the pid that built the data set; a spawned worker imports this afresh


def _how_started() -> str:
    """Forked from its rank (this module's state came along), forked from a fork server (its
    parent), or started afresh (spawn: its own interpreter, child of the rank)."""
    if _BUILT_IN == os.getppid():
        return "forked"
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
        return "fork server" if b"forkserver" in fh.read() else "afresh"


def start_data(cfg):
    """Each loader worker records how it began in PROBE_OUT/start<pid>."""
    global _BUILT_IN
    _BUILT_IN = os.getpid()
    return _WorkerSet(os.environ["PROBE_OUT"], "start", _how_started), None, _INFO


# ----------------------------------------------------------------------------- what a rank imported

HEAVY = ("torch._dynamo", "torchvision")  # seconds of CPU to import


def modules_present(names, out) -> None:
    """In a process forked from a fork server: which of `names` it was born with (put on `out`)."""
    import sys

    out.put([n for n in names if n in sys.modules])


def modules_model(info, out: str) -> torch.nn.Module:
    """The mlp; each forward writes to OUT which of HEAVY the rank has loaded so far, and (asked
    once) which the fork server its loader workers come from holds: a process forked from it tells."""
    import json
    import multiprocessing as mp
    import sys

    net = mlp(info, 16)
    seen: dict = {}

    def before(mod, args):
        if "server" not in seen:
            ctx = mp.get_context("forkserver")  # the rank's one server, that its workers came from
            q = ctx.SimpleQueue()
            p = ctx.Process(target=modules_present, args=(HEAVY, q))
            p.start()
            seen["server"] = q.get()
            p.join()
        seen["rank"] = [n for n in HEAVY if n in sys.modules]
        with open(out, "w") as fh:
            json.dump(seen, fh)

    net.register_forward_pre_hook(before)
    return net
