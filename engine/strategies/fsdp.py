"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks."""
import contextlib

from ..config import combination
from . import world_size
from .process_group import ProcessGroupStrategy


class FSDPStrategy(ProcessGroupStrategy):
    """Each block with parameters is its own FSDP unit (all-gathered just before its forward,
    freed after), and the root takes what is left. Gradients are reduce-scattered and averaged
    over ranks, so training matches DDP step for step."""

    name = "fsdp"
    imports_dynamo = True  # its DTensors' sharding rules run fake tensors, which read dynamo's config
    summary = "FSDP2 fully_shard per block and at the root"
    order = 60
    section = "fsdp"
    can_shard = True
    compared_by_default = True
    channels_last_weights = False  # fully_shard refuses non-contiguous parameters

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if cfg.fsdp.state_dict == "sharded":
            p.append(("fsdp.state_dict", "sharded checkpoints (one file per rank) are not supported yet; "
                                         "use full (gathered on rank 0, loads without FSDP)"))
        if cfg.accelerator == "cuda" and cfg.resolved_backend == "gloo":
            # seen on an H100 (torch 2.11): the rank died of SIGSEGV at its first checkpoint
            p.append(combination(cfg, "backend", "fsdp on GPUs needs nccl: over gloo PyTorch crashes (SIGSEGV) "
                                 "gathering the sharded weights of CUDA ranks (pytorch/pytorch#132471); use backend "
                                 "nccl or auto", "strategy", "accelerator", "backend"))
        return p

    def shards(self, cfg):
        w = world_size(cfg)
        return w, w, w

    def wrap(self, model, ctx):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = model.to(ctx.device)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        reshard = ctx.cfg.fsdp.reshard_after_forward
        for block in units(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model

    def unwrap(self, model):
        # fully_shard swaps the class in place and keeps every key; there is no wrapper to remove.
        # The parameters are DTensor shards though: save through model_state, not state_dict().
        return model

    @contextlib.contextmanager
    def no_sync(self, model):
        """Micro-steps keep their gradients unreduced on each rank; the final one reduce-scatters the sum."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    # ------------------------------------------------------------ checkpoint state
    @staticmethod
    def _options(**extra):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **extra)

    def model_state(self, model, ctx) -> dict:
        """Gathered to full tensors on rank 0's CPU (other ranks get {}): loads without FSDP."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model, options=self._options(cpu_offload=True))

    def optim_state(self, optimizer, model, ctx) -> dict:
        """Keyed by parameter name (not position), full tensors on rank 0's CPU."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=self._options(cpu_offload=True))

    def load_model_state(self, model, state: dict, ctx) -> None:
        """Every rank passes the full dict; each keeps its own shard."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, _containers_copied(state), options=self._options())

    def load_optim_state(self, optimizer, model, state: dict, ctx) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, _containers_copied(state), options=self._options())


def units(model) -> list:
    """The blocks that become FSDP units of their own: each child with trainable parameters; a
    ModuleList's or ModuleDict's members instead of the container (it has no forward of its own,
    so its hooks would never gather the weights: a language model's list of transformer blocks);
    and none that shares a parameter with another child (tied weights, as a language model's head
    and its token embedding: the root unit holds those, sharded once)."""
    import torch

    def members(module):
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            return [m for child in module.children() for m in members(child)]
        return [module]

    blocks = [b for child in model.children() for b in members(child)
              if any(p.requires_grad for p in b.parameters())]
    seen: dict[int, set] = {}
    for i, b in enumerate(blocks):
        for p in b.parameters():
            seen.setdefault(id(p), set()).add(i)
    shared = {i for ids in seen.values() if len(ids) > 1 for i in ids}
    return [b for i, b in enumerate(blocks) if i not in shared]


def _containers_copied(obj):
    """The set_*_state_dict helpers replace entries with DTensor shards in place; copy the dicts
    and lists (not the tensors) so the caller's checkpoint stays a plain, full state dict."""
    if isinstance(obj, dict):
        return {k: _containers_copied(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_containers_copied(v) for v in obj]
    return obj


STRATEGY = FSDPStrategy()
