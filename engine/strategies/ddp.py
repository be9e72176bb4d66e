"""DistributedDataParallel: one process per device, gradients all-reduced in buckets."""
from .process_group import ProcessGroupStrategy


class DDPStrategy(ProcessGroupStrategy):
    name = "ddp"
    summary = "DistributedDataParallel, one process per device"
    order = 40
    section = "ddp"
    comm_measured = True  # engine.train times DDP's all-reduce with a comm hook on CPU ranks
    compared_by_default = True

    def memory_parts(self, cfg, n, device):
        if not cfg.ddp.gradient_as_bucket_view:
            device["ddp buckets"] = 4 * n  # DDP's flat all-reduce buffers, a copy of the gradients
        return {}

    def wrap(self, model, ctx):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        d = ctx.cfg.ddp
        if d.sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(ctx.device)
        cuda = ctx.device.type == "cuda"
        return DDP(model, device_ids=[ctx.device.index] if cuda else None,
                   output_device=ctx.device.index if cuda else None,
                   bucket_cap_mb=d.bucket_cap_mb, gradient_as_bucket_view=d.gradient_as_bucket_view,
                   static_graph=d.static_graph, find_unused_parameters=d.find_unused_parameters)

    def unwrap(self, model):
        return getattr(model, "module", model)

    def no_sync(self, model):
        return model.no_sync()


STRATEGY = DDPStrategy()
