"""Model (pipeline) parallel in one process: consecutive layers on consecutive devices."""
from ..config import combination
from .base import Strategy


class ModelParallelStrategy(Strategy):
    name = "model-parallel"
    summary = "one process, layers split across devices, optional micro-batch pipelining"
    order = 50
    section = "model_parallel"
    repeats_devices = True  # two stages may share a GPU

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        mp = cfg.model_parallel
        n_dev = self.stage_count(cfg)
        if n_dev < 2:
            p.append(("devices", "model-parallel splits the model over 2 or more devices (cpu: devices: 2 repeats the CPU)"))
        if mp.split and (len(mp.split) != n_dev or any((not isinstance(s, int)) or s < 1 for s in mp.split)):
            p.append(("model_parallel.split", f"one positive layer count per device ({n_dev}), got {mp.split}"))
        if cfg.data.dataset == "text" or cfg.model.name == "gpt":
            p.append(combination(cfg, "strategy", "model-parallel splits an nn.Sequential whose first layer takes "
                                 "the batch's first tensor; text batches are dicts (input_ids, labels) passed as "
                                 "model(**batch) to a model that returns its own loss: use ddp, fsdp, zero or "
                                 "deepspeed", "strategy", "data.dataset", "model.name"))
        if mp.micro_batches > cfg.train.batch_size:
            p.append(("model_parallel.micro_batches", f"at most the batch size ({cfg.train.batch_size}), got {mp.micro_batches}"))
        return p

    def cpu_devices_hint(self) -> str:
        return "pipeline stages, all on the CPU, in one process (2 or more)"

    def stage_count(self, cfg) -> int:
        if cfg.accelerator == "cpu":
            return cfg.devices if isinstance(cfg.devices, int) else 1
        return len(cfg.devices) if isinstance(cfg.devices, list) else 1

    def shards(self, cfg):
        """Layers balanced by parameters over the distinct devices (on the CPU: one memory)."""
        k = max(1, len(set(cfg.devices)) if isinstance(cfg.devices, list) else self.nprocs(cfg))
        return k, k, k

    def local_devices(self, cfg, local_rank):
        if cfg.accelerator == "cpu":
            return ["cpu"] * self.stage_count(cfg)
        return [f"cuda:{i}" for i in cfg.devices]

    # ------------------------------------------------------------ runtime
    def wrap(self, model, ctx):
        from ._pipeline import Pipeline

        mp = ctx.cfg.model_parallel
        return Pipeline(model, self.local_devices(ctx.cfg, ctx.local_rank),
                        split=list(mp.split) or None, micro_batches=mp.micro_batches)

    def targets_device(self, ctx):
        """The logits come out of the last stage."""
        import torch

        last = torch.device(self.local_devices(ctx.cfg, ctx.local_rank)[-1])
        return None if last == torch.device(ctx.device) else last

    def unwrap(self, model):
        # The original model object: its layers live on several devices but its keys are unchanged.
        return getattr(model, "module", model)


STRATEGY = ModelParallelStrategy()
