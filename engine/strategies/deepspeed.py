"""DeepSpeed (ZeRO stages 0-3, CPU offload) on torchdeck's own data path, rendezvous and events.

Config side (no torch, no deepspeed at import): the rules, the ds_config torchdeck generates from
the run config, and how a user's own ds_config.json is laid over it (its values win; where they
differ from the form's, the run says so). The runtime half is `_deepspeed.py`.

DeepSpeed is an optional extra: `pip install 'torchdeck[deepspeed]'`.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from ..config import combination
from ..errors import TorchdeckError
from ..files import write_atomic
from ..rundir.layout import CHECKPOINT_META  # torch-free: the one rule for checkpoint names
from . import world_size as world_size_of
from .process_group import ProcessGroupStrategy

INSTALL_HINT = "not installed: pip install 'torchdeck[deepspeed]'"
GENERATED_NAME = "ds_config.json"  # what the run used, in its run directory

# ds_config key -> the torchdeck setting it stands for (named in conflict reports)
_SETTING = {
    "train_micro_batch_size_per_gpu": "train.batch_size",
    "gradient_accumulation_steps": "train.grad_accum",
    "train_batch_size": "the global batch",
    "gradient_clipping": "train.grad_clip",
    "bf16.enabled": "train.precision",
    "fp16.enabled": "train.precision",
    "optimizer.type": "optimizer.name",
    "optimizer.params.lr": "optimizer.lr",
    "optimizer.params.momentum": "optimizer.momentum",
    "optimizer.params.nesterov": "optimizer.nesterov",
    "optimizer.params.weight_decay": "optimizer.weight_decay",
    "optimizer.params.betas": "optimizer.betas",
    "zero_optimization.stage": "deepspeed.stage",
    "zero_optimization.offload_optimizer.device": "deepspeed.offload_optimizer",
    "zero_optimization.offload_param.device": "deepspeed.offload_param",
    "zero_optimization.overlap_comm": "deepspeed.overlap_comm",
    "zero_optimization.contiguous_gradients": "deepspeed.contiguous_gradients",
}
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_OPTIMIZER_TYPES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


class DeepSpeedConfigError(TorchdeckError, ValueError):
    """A ds_config.json that cannot be used, said with its path and the key (field deepspeed.config)."""

    field = "deepspeed.config"

    def __init__(self, why: str):
        self.why = why
        super().__init__(f"{self.field}: {why}")


def installed() -> bool:
    """Without importing it (the app asks on every edit, and must not pull in torch)."""
    try:
        return importlib.util.find_spec("deepspeed") is not None
    except (ImportError, ValueError):
        return False


SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU accelerator JIT-builds it at init_distributed (ShareMemCommBuilder)


def skip_shm_op() -> bool:
    """Tell DeepSpeed not to build its shared-memory op in a training rank on its CPU accelerator.

    DeepSpeed 0.19 compiles deepspeed_shm_comm with g++ in every init_distributed unless
    deepspeed.ops.__compatible_ops__ marks it unbuildable: a CPU-minute on a host's first DeepSpeed
    run (cached afterwards), while the Monitor said 'building the model'. Only inference_all_reduce,
    DeepSpeed inference's tensor-parallel all-reduce, uses it; training's all_reduce, all_gather and
    reduce_scatter go through torch.distributed. A user's own script (torchdeck launch) still builds
    it. Returns whether it was marked (no: another accelerator, which has no such op)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return False
    deepspeed.ops.__compatible_ops__[SHM_OP] = False
    return True


def pin_ninja() -> str | None:
    """Put the ninja that DeepSpeed requires (the `ninja` wheel, in this Python's environment) first
    on this process's PATH, so its JIT builds (cpu_adam for an offloaded Adam on a GPU, ...) run one
    ninja whoever started the run. torch runs whichever `ninja` PATH finds, and two ninja versions
    hash the same compile command differently (1.11's .ninja_log v5 against the wheel's 1.13, v7): a
    run from a shell with the venv's bin on PATH and one without each took the other's objects for
    stale and rebuilt them (deepspeed_shm_comm's, before skip_shm_op: 25 s to 3 minutes each time).
    Returns the folder put first, or None where PATH already finds it (or there is none)."""
    try:
        import ninja
    except ImportError:
        return None
    folder = getattr(ninja, "BIN_DIR", "")
    exe = Path(folder or ".") / "ninja"
    if not folder or not exe.is_file():
        return None
    found = shutil.which("ninja")
    if found and Path(found).resolve() == exe.resolve():
        return None
    os.environ["PATH"] = os.pathsep.join([folder] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p])
    return folder


_MUON = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.zero.muon.original_muon")
_STAND_IN = "torchdeck's stand-in: no Muon optimizer in this rank (strategies/deepspeed.py skip_muon)"


def skip_muon(ds_config: dict) -> bool:
    """Spare a rank whose optimizer is not Muon the import of DeepSpeed's Muon modules, 2 CPU-s.

    DeepSpeed 0.19 imports them at initialize and at every ZeRO step only to ask whether the
    optimizer is a MuonWithAuxAdam; importing them torch.compile's three kernels, which loads
    torch._inductor and triton. DeepSpeed builds a Muon only for an optimizer of type "muon" (and
    torchdeck hands it no optimizer of its own), so for any other type the answer is no whichever
    class it checks against: the rank gets stand-ins, a class nothing is an instance of and a
    muon_update that loads the real modules if it were ever called. Not where they are loaded."""
    opt = ds_config.get("optimizer")
    if str(opt.get("type", "") if isinstance(opt, dict) else "").lower() == "muon":
        for m in _MUON:  # a Muon run after another run in this process: the real modules
            if getattr(sys.modules.get(m), "__doc__", None) == _STAND_IN:
                del sys.modules[m]
        return False
    if any(m in sys.modules for m in _MUON):
        return False
    import types

    def muon_update(*args, **kwargs):
        for m in _MUON:
            sys.modules.pop(m, None)
        return importlib.import_module(_MUON[1]).muon_update(*args, **kwargs)

    stand = [types.ModuleType(m, _STAND_IN) for m in _MUON]
    stand[0].MuonWithAuxAdam = type("MuonWithAuxAdam", (), {})
    stand[1].muon_update = muon_update
    sys.modules.update((m.__name__, m) for m in stand)
    return True


# ----------------------------------------------------------------------------- ds_config


def generate(cfg, world_size: int | None = None) -> dict:
    """The ds_config for this run config, before any user file is laid over it.

    The optimizer is DeepSpeed's from this config (so a user's file can change it); the LR schedule
    is torchdeck's own, handed to DeepSpeed as a client scheduler, so every strategy gets the same
    curve (a "scheduler" section in the user's file replaces it).
    """
    t, o, d = cfg.train, cfg.optimizer, cfg.deepspeed
    world = world_size or world_size_of(cfg)
    out: dict = {
        "train_batch_size": t.batch_size * t.grad_accum * world,
        "train_micro_batch_size_per_gpu": t.batch_size,
        "gradient_accumulation_steps": t.grad_accum,
        "steps_per_print": 2 ** 31 - 1,  # torchdeck reports progress itself
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,  # torch's SGD/Adam under ZeRO: what torchdeck tests
    }
    # Said even when off, so a user's file that turns them on shows as replacing the form's value.
    out["gradient_clipping"] = t.grad_clip
    out["bf16"] = {"enabled": t.precision == "bf16-mixed"}
    out["fp16"] = {"enabled": t.precision == "16-mixed"}
    if t.precision == "16-mixed":
        out["fp16"].update(loss_scale=0, initial_scale_power=16)  # dynamic loss scaling
    _buffers_follow(out, {})
    params: dict = {"lr": o.lr, "weight_decay": o.weight_decay}
    if o.name == "sgd":
        params.update(momentum=o.momentum, nesterov=o.nesterov)
    else:
        params["betas"] = list(o.betas)
        # torch's own Adam(W): the same updates as every other strategy. With the optimizer offloaded
        # from a GPU, DeepSpeed's CPU Adam is the point of offloading: leave it to DeepSpeed.
        if not (d.offload_optimizer == "cpu" and cfg.accelerator == "cuda"):
            params["torch_adam"] = True
        if o.name == "adam":
            params["adam_w_mode"] = False  # DeepSpeed's "Adam" is AdamW unless told otherwise
    out["optimizer"] = {"type": _OPTIMIZER_TYPES[o.name], "params": params}
    zero: dict = {"stage": d.stage, "overlap_comm": d.overlap_comm, "contiguous_gradients": d.contiguous_gradients}
    if d.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.accelerator == "cuda"}
    if d.offload_param == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.accelerator == "cuda"}
    out["zero_optimization"] = zero
    if cfg.nodes.num_nodes > 1 and not cfg.checkpoint.dir:
        # each node checkpoints into its own run directory: every node then writes the model states
        out["checkpoint"] = {"use_node_local_storage": True}
    return out


def load_user(path: str) -> dict:
    """The user's ds_config.json, or DeepSpeedConfigError naming the file and what is wrong."""
    p = Path(path).expanduser()
    where = repr(str(p))
    if not p.exists():
        raise DeepSpeedConfigError(f"{where}: no such file (a ds_config.json, or leave deepspeed.config empty "
                                   "to use the generated one)")
    if p.is_dir():
        raise DeepSpeedConfigError(f"{where} is a folder; point it at a ds_config.json file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DeepSpeedConfigError(f"{where}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        at = f" at line {line}, column {col}" if line else ""
        raise DeepSpeedConfigError(f"{where}: not valid JSON{at}: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(f"{where}: must be a JSON object of settings, got {type(data).__name__}")
    return data


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _merge(ours: dict, theirs: dict) -> dict:
    out = copy.deepcopy(ours)
    for k, v in theirs.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def merge(generated: dict, user: dict) -> tuple[dict, list[tuple[str, object, object]]]:
    """The user's values over the generated ones; (merged, [(key, theirs, ours)] where they differ).

    An optimizer of another type replaces ours whole (our parameters may not fit it)."""
    generated = copy.deepcopy(generated)
    theirs_opt = user.get("optimizer")
    if isinstance(theirs_opt, dict) and str(theirs_opt.get("type", "")).lower() not in (
            "", str(generated["optimizer"]["type"]).lower()):
        conflicts = [("optimizer.type", theirs_opt.get("type"), generated["optimizer"]["type"])]
        generated.pop("optimizer")
    else:
        conflicts = []
    ours, mine = _leaves(generated), _leaves(user)
    conflicts += [(k, mine[k], ours[k]) for k in mine if k in ours and mine[k] != ours[k]]
    return _merge(generated, user), conflicts


def _int_key(d: dict, key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None or v == "auto":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DeepSpeedConfigError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def _batches(merged: dict, user: dict, world: int, where: str) -> tuple[int, int]:
    """(micro batch per rank, accumulation steps) as DeepSpeed will read them: any two of
    train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps set the third."""
    tb, mb, gas = (_int_key(user, k, where) for k in _BATCH_KEYS)
    if tb is None:
        return (mb or merged["train_micro_batch_size_per_gpu"]), (gas or merged["gradient_accumulation_steps"])
    if mb is None and gas is None:
        gas = merged["gradient_accumulation_steps"]
    if mb is None:
        mb, rest = divmod(tb, gas * world)
    elif gas is None:
        gas, rest = divmod(tb, mb * world)
    else:
        rest = tb - mb * gas * world
    if rest or not mb or not gas:
        raise DeepSpeedConfigError(
            f"{where}: train_batch_size {tb} must equal train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps x world size {world}" + (f" ({mb} x {gas} x {world} = {mb * gas * world})"
                                                                   if mb and gas else ""))
    return mb, gas


class Resolved:
    """The ds_config a run uses, what it changed in the run config, and where the two disagreed."""

    def __init__(self, ds_config: dict, adopted: dict, conflicts: list, source: str):
        self.ds_config, self.adopted, self.conflicts, self.source = ds_config, adopted, conflicts, source

    def notes(self) -> list[tuple[str, str]]:
        """(level, line) for the run log and `torchdeck validate`."""
        z = self.ds_config.get("zero_optimization", {})
        off = [f"{what} offloaded to {z[key]['device']}" for key, what in
               (("offload_optimizer", "optimizer"), ("offload_param", "parameters"))
               if isinstance(z.get(key), dict) and z[key].get("device", "none") != "none"]
        head = f"deepspeed: ZeRO stage {z.get('stage', 0)}" + (", " + ", ".join(off) if off else "")
        head += f"; ds_config generated{' with ' + self.source + ' over it' if self.source else ''}"
        out = [("info", head)]
        for key, theirs, ours in self.conflicts:
            setting = _SETTING.get(key)
            what = f" ({setting})" if setting else ""
            out.append(("warning", f"deepspeed.config {self.source}: {key} = {json.dumps(theirs)} replaces "
                                   f"{json.dumps(ours)}{what}"))
        if "scheduler" in self.ds_config and self.adopted.get("_scheduler_replaced"):
            out.append(("warning", f"deepspeed.config {self.source}: its scheduler "
                                   f"({self.ds_config['scheduler'].get('type')}) replaces torchdeck's "
                                   f"scheduler {self.adopted['_scheduler_replaced']}"))
        return out


def _buffers_follow(ds_config: dict, user: dict) -> None:
    """data_types.buffer_dtype = the training type, unless the user's file sets it.

    DeepSpeed 0.19 casts the parameters only: BatchNorm's running statistics stayed fp32 beside
    bf16 weights, which batch_norm refuses (a ResNet died at its first step). The buffers go to the
    training type too, as DeepSpeed's blanket module.bfloat16()/half() did before. Decided on the
    merged config, so a user's file that turns bf16 on or off gets the matching buffers."""
    if "buffer_dtype" in (user.get("data_types") if isinstance(user.get("data_types"), dict) else {}):
        return
    on = [k for k in ("bf16", "fp16") if isinstance(ds_config.get(k), dict) and ds_config[k].get("enabled")]
    types = ds_config.get("data_types") if isinstance(ds_config.get("data_types"), dict) else {}
    types = {k: v for k, v in types.items() if k != "buffer_dtype"} | ({"buffer_dtype": on[0]} if len(on) == 1 else {})
    if types:
        ds_config["data_types"] = types
    else:
        ds_config.pop("data_types", None)


def resolve(cfg, world_size: int | None = None) -> Resolved:
    """The generated ds_config with the user's file over it, checked; DeepSpeedConfigError otherwise."""
    world = world_size or world_size_of(cfg)
    generated = generate(cfg, world)
    path = cfg.deepspeed.config
    if not path:
        return Resolved(generated, {}, [], "")
    user = load_user(path)
    where = repr(str(Path(path).expanduser()))
    merged, conflicts = merge(generated, user)
    mb, gas = _batches(merged, user, world, where)
    merged.update(train_micro_batch_size_per_gpu=mb, gradient_accumulation_steps=gas, train_batch_size=mb * gas * world)
    bf16 = bool((merged.get("bf16") or {}).get("enabled")) if isinstance(merged.get("bf16"), dict) else False
    fp16 = bool((merged.get("fp16") or {}).get("enabled")) if isinstance(merged.get("fp16"), dict) else False
    if bf16 and fp16:
        raise DeepSpeedConfigError(f"{where}: bf16 and fp16 are both enabled; enable one of them")
    if fp16 and cfg.accelerator != "cuda":
        raise DeepSpeedConfigError(f"{where}: fp16 needs CUDA; on the CPU use bf16 or neither")
    _buffers_follow(merged, user)
    zero = merged.get("zero_optimization")
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f"{where}: zero_optimization must be an object of settings")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise DeepSpeedConfigError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    clip = merged.get("gradient_clipping", 0.0)
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
        raise DeepSpeedConfigError(f"{where}: gradient_clipping must be 0 or a positive number, got {clip!r}")
    adopted = {"train.batch_size": mb, "train.grad_accum": gas, "train.grad_clip": float(clip),
               "train.precision": "bf16-mixed" if bf16 else "16-mixed" if fp16 else "32-true"}
    lr = (merged.get("optimizer") or {}).get("params", {}).get("lr") if isinstance(merged.get("optimizer"), dict) else None
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0:
        adopted["optimizer.lr"] = float(lr)
    if "scheduler" in user and cfg.scheduler.name != "none":
        adopted["_scheduler_replaced"] = cfg.scheduler.name
    return Resolved(merged, adopted, conflicts, str(Path(path).expanduser()))


def apply(cfg, resolved: Resolved) -> None:
    """Make the run config say what DeepSpeed will do (the loader's batch, accumulation, precision)."""
    for path, value in resolved.adopted.items():
        if path.startswith("_"):
            continue
        section, name = path.split(".")
        setattr(getattr(cfg, section), name, value)


def write_generated(ds_config: dict, run_dir) -> Path:
    """ds_config.json in the run directory, atomically: the user can read and reuse it."""
    path = Path(run_dir) / GENERATED_NAME
    write_atomic(path, json.dumps(ds_config, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- the strategy


class DeepSpeedStrategy(ProcessGroupStrategy):
    """deepspeed.initialize on torchdeck's process group, model, data loader and loop; DeepSpeed
    owns the optimizer step (ZeRO partitioning, clipping, loss scaling) and its own checkpoints."""

    name = "deepspeed"
    imports_dynamo = True  # DeepSpeed's own code imports it (its engine and ZeRO optimizers)
    summary = "DeepSpeed ZeRO (stages 0-3, CPU offload)"
    order = 80
    section = "deepspeed"
    can_shard = True
    own_launcher = True  # `torchdeck export --deepspeed`: a hostfile and one deepspeed command per node
    checkpoint_dirs = True  # DeepSpeed's own checkpoint: a directory, every rank writes its part
    min_world = 1  # ZeRO-Offload on one GPU is a use of its own
    channels_last_weights = False  # it broadcasts each weight as a byte view (last stride 1 needed)

    def shards(self, cfg):
        """ZeRO stage 1 shards the optimizer state, 2 the gradients too, 3 the parameters too."""
        w, stage = world_size_of(cfg), cfg.deepspeed.stage
        return (w if stage >= 3 else 1), (w if stage >= 2 else 1), (w if stage >= 1 else 1)

    def memory_parts(self, cfg, n, device):
        p_split = self.shards(cfg)[0]
        if cfg.train.precision != "32-true":  # the half-precision copy beside the fp32 master weights
            device["parameters"] += 2 * n / p_split
        host = {}
        if cfg.deepspeed.offload_optimizer == "cpu":
            host["optimizer state"] = device.pop("optimizer state")
        if cfg.deepspeed.offload_param == "cpu":
            host["parameters"] = device.pop("parameters")
        return host

    def check(self, cfg, hw):
        p = super().check(cfg, hw)
        if not installed():
            p.append(("strategy", f"deepspeed: {INSTALL_HINT}"))
        d = cfg.deepspeed
        if d.stage not in (0, 1, 2, 3):
            p.append(("deepspeed.stage", f"ZeRO stage must be 0, 1, 2 or 3, got {d.stage}"))
        if d.offload_param == "cpu" and d.stage != 3:
            p.append(combination(cfg, "deepspeed.offload_param", "offloading parameters needs ZeRO stage 3",
                                 "deepspeed.offload_param", "deepspeed.stage"))
        if d.offload_optimizer == "cpu" and d.stage == 0:
            p.append(combination(cfg, "deepspeed.offload_optimizer", "offloading the optimizer needs ZeRO stage 1, 2 or 3",
                                 "deepspeed.offload_optimizer", "deepspeed.stage"))
        if cfg.train.compile:
            p.append(combination(cfg, "train.compile", "deepspeed runs the model through its own engine; turn train.compile off",
                                 "strategy", "train.compile"))
        return p

    def preflight(self, cfg) -> list[tuple[str, str]]:
        p = []
        try:
            resolve(cfg)
        except DeepSpeedConfigError as exc:
            p.append((exc.field, exc.why))
        resume = cfg.checkpoint.resume
        if resume and resume != "latest":
            if not (Path(resume).expanduser() / CHECKPOINT_META).is_file():
                p.append(("checkpoint.resume", f"no DeepSpeed checkpoint directory at {resume!r} (use a ckpt-* "
                                               f"folder from a deepspeed run's checkpoints/, or 'latest')"))
        return p

    def resolve(self, cfg, run_dir=None) -> list[tuple[str, str]]:
        r = resolve(cfg)
        apply(cfg, r)
        if run_dir is not None:  # a run starting (validate passes none)
            write_generated(r.ds_config, run_dir)
        return r.notes()

    # ------------------------------------------------------------ runtime (torch, deepspeed)
    def setup(self, model, ctx, total_steps: int, steps_per_epoch: int):
        from . import _deepspeed

        pin_ninja()  # before init_distributed and initialize, which may JIT-build DeepSpeed's ops
        skip_shm_op()
        resolved = resolve(ctx.cfg, ctx.world_size)
        skip_muon(resolved.ds_config)
        return _deepspeed.setup(model, ctx, resolved, total_steps, steps_per_epoch)

    def unwrap(self, model):
        return getattr(model, "module", model)

    def no_sync(self, model):
        from . import _deepspeed

        return _deepspeed.micro_step(model)

    def save_checkpoint(self, trainer, meta: dict):
        from . import _deepspeed

        return _deepspeed.save(trainer.model, trainer.ckpt_dir, meta, trainer.cfg, trainer.ctx)

    def load_checkpoint(self, trainer, path, meta: dict) -> None:
        from . import _deepspeed

        _deepspeed.load(trainer.model, path, meta, trainer.ctx)


STRATEGY = DeepSpeedStrategy()
