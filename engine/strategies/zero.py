"""DDP with ZeroRedundancyOptimizer: the optimizer state is sharded across ranks."""
from . import world_size
from .ddp import DDPStrategy


class ZeroStrategy(DDPStrategy):
    """Model, sampler and no_sync are DDP's; only the optimizer differs.

    Each rank keeps optimizer state for its shard of the parameters (ZeRO stage 1), steps only
    that shard, then broadcasts the updated shard: the same weights as DDP, with about
    1/world of the optimizer memory per rank.
    """

    name = "zero"
    summary = "DDP + ZeroRedundancyOptimizer (optimizer state sharded)"
    order = 70
    can_shard = True

    def shards(self, cfg):
        return 1, 1, world_size(cfg)

    def make_optimizer(self, params_fn, model):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kwargs = _optimizer_recipe(params_fn, model)
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)

    def optim_state(self, optimizer, model, ctx) -> dict:
        # A collective: every rank sends its shard to rank 0, which alone can return the whole.
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if ctx.rank == 0 else {}

    def load_optim_state(self, optimizer, model, state: dict, ctx) -> None:
        # The consolidated dict holds every shard; each rank keeps its own part. load_state_dict
        # blanks other ranks' entries in the dict it is given, so give it a copy.
        optimizer.load_state_dict({**state, "state": dict(state["state"])})


def _optimizer_recipe(params_fn, model):
    """(optimizer class, constructor kwargs) for ZeroRedundancyOptimizer.

    Uses params_fn.optimizer_class/optimizer_kwargs when the loop attached them; otherwise builds
    the optimizer once on the real parameters (no state is allocated before a step) and reads its
    class and defaults, keeping only what the constructor accepts.
    """
    import inspect

    cls = getattr(params_fn, "optimizer_class", None)
    kwargs = getattr(params_fn, "optimizer_kwargs", None)
    if cls is not None and kwargs is not None:
        return cls, dict(kwargs)
    probe = params_fn(model.parameters())
    cls = type(probe)
    accepted = inspect.signature(cls.__init__).parameters
    return cls, {k: v for k, v in probe.defaults.items() if k in accepted}


STRATEGY = ZeroStrategy()
