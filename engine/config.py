"""The run config: one schema shared by the form, presets, the CLI and the engine.

Importable without torch (the app imports it on its first frame). Every error names the field
it is about, so the form can mark that field and the CLI can print one clear line.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from .errors import TorchdeckError
from .files import write_atomic
from .network import host_problem
from .kinds import kind_of

SCHEMA_VERSION = 1

# strategy: one of engine.strategies.names() (the strategies list themselves; engine.preflight checks it)
LOCAL_RANK_ARGS = ("", "--local-rank", "--local_rank")  # script.local_rank_arg
ACCELERATORS = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl", "mpi")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("none", "step", "cosine", "onecycle", "warmup")
OFFLOAD = ("none", "cpu")  # deepspeed.offload_optimizer / offload_param
BUILTIN_MODELS = ("cnn", "resnet18", "mlp", "gpt")
CNN_MIN_IMAGE = 14  # px: model cnn's two 5x5 convolutions and 2x2 pools leave nothing of a smaller image
CPU_AFFINITY = ("auto", "exclusive", "none")  # train.cpu_affinity (engine/affinity.py)
CACHE_MODES = ("auto", "ram", "none")  # data.cache (engine/cache.py)
WORKER_STARTS = ("auto", "fork", "spawn", "forkserver")  # data.worker_start: DataLoader's multiprocessing_context
AUGMENTS = ("none", "flip", "crop", "crop+flip")  # data.augment
LOSSES = ("auto", "cross_entropy", "mse", "bce")  # train.loss, or package.module:callable (engine/losses.py)
BUILTIN_DATASETS = ("synthetic", "cifar10", "mnist", "fashionmnist", "imagefolder", "text")
_SCI_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Combination(tuple):
    """A (field, reason) problem that several values cause together (strategy dp with accelerator
    cpu); `values` holds each of them (field path -> value), so an error can say where each one
    came from when they came from different places (a preset, a --set, the default)."""

    values: dict

    def __new__(cls, field: str, why: str, values: dict):
        self = super().__new__(cls, (field, why))
        self.values = dict(values)
        return self


def combination(cfg, field: str, why: str, *paths: str) -> Combination:
    """The problem `why` filed under `field`, caused by the values of `paths` together."""
    def value(path: str):
        node = cfg
        for part in path.split("."):
            node = getattr(node, part)
        return node

    return Combination(field, why, {p: value(p) for p in paths})


class ConfigError(TorchdeckError, ValueError):
    """All problems found in one config; each is (field path, reason)."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None,
                 field_sources: dict[str, str] | None = None, value_sources: dict[str, str] | None = None):
        self.problems = problems
        self.source = source
        self.field_sources = field_sources or {}  # field -> where its value came from, if not `source`
        self.value_sources = value_sources or {}  # a Combination's other fields -> where each came from
        lines = []
        for problem in problems:
            f, why = problem
            mixed = self._sources(problem)
            if mixed:  # from different places: each value with its own
                lines.append(f"{f}: {why} (" + ", ".join(f"{p} {_plain(v)} from {where}" for p, v, where in mixed) + ")")
                continue
            where = self.field_sources.get(f, source)
            where = f"{where}: " if where else ""
            lines.append(f"{where}{f}: {why}" if f else f"{where}{why}")
        super().__init__("\n".join(lines))

    def _sources(self, problem) -> list[tuple[str, Any, str]]:
        """[(field, value, where it came from)] of a combination whose values came from more than one
        place, else []."""
        values = getattr(problem, "values", None) or {}
        said = [(p, v, self.value_sources.get(p) or self.field_sources.get(p) or self.source) for p, v in values.items()]
        return said if len({where for _, _, where in said}) > 1 and all(where for _, _, where in said) else []

    def by_field(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for f, why in self.problems:
            out.setdefault(f, why)
        return out


# ----------------------------------------------------------------------------- sections


@dataclass
class NodesConfig:
    """Where the ranks meet (torchrun's vocabulary)."""

    num_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500  # 0: pick a free port (single node only)
    timeout_s: int = 300  # collective and rendezvous timeout
    ifname: str = ""  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME when set


@dataclass
class ModelConfig:
    name: str = "cnn"  # cnn | resnet18 | mlp | gpt | package.module:callable
    small_stem: bool = True  # resnet18: 3x3 stem, no max-pool, for 32x32 images
    hidden: int = 256  # mlp width
    n_layer: int = 4  # gpt: transformer blocks
    n_head: int = 4  # gpt: attention heads (n_embd must be a multiple)
    n_embd: int = 128  # gpt: width
    block_size: int = 64  # gpt: context length; the text data set's samples are this many tokens
    kwargs: dict = field(default_factory=dict)  # passed to a user callable (gpt: its sizes, these names win)


@dataclass
class DataConfig:
    dataset: str = "synthetic"  # synthetic | cifar10 | mnist | fashionmnist | imagefolder | module:callable
    root: str = "./data"
    download: bool = True  # torchvision sets: fetch when missing (needs network)
    train_size: int = 8192  # synthetic only
    val_size: int = 2048  # synthetic only
    num_classes: int = 10  # synthetic only
    image_size: int = 32  # synthetic: generated size; imagefolder: images resized to it
    cache: str = "auto"  # auto | ram | none: image folders and torchvision sets decoded once (engine/cache.py)
    cache_budget_mb: int = 0  # for the node's ranks together; 0: a quarter of this host's memory
    augment: str = "none"  # none | flip | crop | crop+flip (random crop after size/8 zero padding)
    num_workers: int = -1  # loader processes per rank; -1: none for in-memory sets (tensors, text, a set
    # whose class says in_memory = True), else cores/ranks - 1 (<= 8)
    prefetch_factor: int = 2  # batches each loader worker keeps ready
    pin_memory: bool = False
    persistent_workers: bool = True  # loader workers live across epochs (with num_workers > 0)
    worker_start: str = "auto"  # auto | fork | spawn | forkserver: how loader workers start (auto: a fork server on Linux)
    on_device: bool = False  # keep a small data set on the GPU


@dataclass
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: list = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class SchedulerConfig:
    name: str = "none"
    step_size: int = 1  # step: epochs between decays
    gamma: float = 0.1  # step: decay factor
    warmup_steps: int = 0  # warmup (and cosine/onecycle warm start): optimizer steps
    min_lr: float = 0.0  # cosine floor


@dataclass
class TrainConfig:
    batch_size: int = 64  # per process (dp: total across its devices)
    epochs: int = 3
    max_steps: int = 0  # optimizer steps; 0: no limit beyond epochs
    grad_accum: int = 1
    precision: str = "32-true"
    grad_clip: float = 0.0  # max grad norm; 0: off
    seed: int = 0
    eval_every_epoch: bool = True
    log_every_n_steps: int = 10  # step events per rank
    report_every_s: float = 5.0  # rank 0 gathers every rank's progress (rank_report event); 0: off
    threads_per_rank: int = 0  # 0: cores / local processes, like torchrun's OMP_NUM_THREADS
    cpu_affinity: str = "auto"  # auto | exclusive | none: each rank on cores of its own (engine/affinity.py)
    channels_last: bool = False
    compile: bool = False
    cudnn_benchmark: bool = True
    tf32: bool = True
    deterministic: bool = False
    # auto | cross_entropy | mse | bce | package.module:callable (engine/losses.py); auto: the model's
    # own loss (output.loss), a scalar output, a (loss, logits, ...) tuple, else cross-entropy on integer targets
    loss: str = "auto"
    # after a failure the supervisor restarts the node's ranks up to this many times (torchrun's
    # --max-restarts): our loop from its newest checkpoint, a script from its start. One field for
    # every kind (a script run's too): restarting is the supervisor's, not the training loop's
    max_restarts: int = 0


@dataclass
class CheckpointConfig:
    dir: str = ""  # empty: <run dir>/checkpoints
    every_n_steps: int = 0  # 0: only at epoch ends (when every_epoch)
    every_epoch: bool = True
    keep_last: int = 3
    resume: str = ""  # "" | latest | path to a checkpoint file


@dataclass
class DDPConfig:
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    sync_batchnorm: bool = False


@dataclass
class ModelParallelConfig:
    split: list = field(default_factory=list)  # layers per device; empty: balance by parameters
    micro_batches: int = 1  # >1: pipeline micro-batches so devices overlap


@dataclass
class FSDPConfig:
    reshard_after_forward: bool = True
    state_dict: str = "full"  # full | sharded


@dataclass
class DeepSpeedConfig:
    """strategy deepspeed: the ds_config torchdeck generates (written to <run dir>/ds_config.json)."""

    stage: int = 2  # ZeRO stage: 0 (plain data parallel), 1 optimizer state, 2 + gradients, 3 + parameters
    offload_optimizer: str = "none"  # none | cpu (stages 1-3)
    offload_param: str = "none"  # none | cpu (stage 3)
    overlap_comm: bool = True  # overlap gradient reduction with the backward pass
    contiguous_gradients: bool = True  # copy gradients into one buffer as they are produced
    config: str = ""  # your own ds_config.json: its values win; where they differ from the form's, the run says so


@dataclass
class LoggingConfig:
    """Where metrics go besides events.jsonl and metrics.csv (always written; engine/metrics.py)."""

    tensorboard: bool = False  # TensorBoard event files in <run dir>/tensorboard (needs the tensorboard package)


@dataclass
class ScriptConfig:
    """strategy script: the user's own script, each rank started as torchrun starts it (torchdeck launch)."""

    path: str = ""  # the user's script (relative to cwd), or "" when module is set
    module: str = ""  # python -m MODULE instead of a path
    args: list = field(default_factory=list)  # the script's own arguments, as strings
    no_python: bool = False  # torchrun --no-python: path is an executable, run as is (no shim)
    local_rank_arg: str = ""  # "" env only (torchrun) | "--local-rank" | "--local_rank" (torch.distributed.launch)
    env: dict = field(default_factory=dict)  # extra environment for every rank
    stop_grace_s: float = 30.0  # stop: SIGTERM, then SIGKILL to the process trees after this
    cwd: str = ""  # the folder the script runs in (torchdeck launch: the folder it was called from)


@dataclass
class SlurmConfig:
    """Where a SLURM job asks to run (engine/slurm); the node count is nodes.num_nodes, each node's rank
    and the master address come from SLURM when the job runs."""

    partition: str = ""  # "": the cluster's default partition
    time: str = "04:00:00"  # the time limit as sbatch --time takes it (MM, HH:MM:SS, D-HH:MM:SS); quote it in YAML
    account: str = ""  # sbatch --account, when the cluster bills one
    qos: str = ""  # sbatch --qos
    constraint: str = ""  # sbatch --constraint: node features, e.g. a100
    gpus_per_node: int = 0  # 0: the ranks per node with accelerator cuda, none on cpu
    sbatch_args: list = field(default_factory=list)  # more sbatch options, passed as given (e.g. --mem=64G)


@dataclass
class RunConfig:
    schema_version: int = SCHEMA_VERSION
    name: str = "run"
    description: str = ""
    strategy: str = "cpu"
    accelerator: str = "cpu"
    # cpu: number of processes (int). cuda: GPU indices, e.g. [0, 2]; in YAML also "0,2",
    # an int N (the first N GPUs) or -1 (all), as Lightning's `devices`.
    devices: Any = 1
    backend: str = "auto"
    init_method: str = "env://"  # env:// | tcp://host:port | file:///path
    nodes: NodesConfig = field(default_factory=NodesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    model_parallel: ModelParallelConfig = field(default_factory=ModelParallelConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    script: ScriptConfig = field(default_factory=ScriptConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    @property
    def kind(self):
        """Torchdeck's loop or the user's script (engine.kinds): what applies to such a run."""
        return kind_of(self.strategy)

    @property
    def is_script(self) -> bool:
        """A run of the user's own script (strategy script): the loop's sections do not apply."""
        return self.kind.is_script

    # ------------------------------------------------------------------ derived values
    # (processes per node, world size and global batch are the strategy's to say:
    # engine.strategies.nproc_per_node / world_size / global_batch)
    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.accelerator == "cuda" else "gloo"

    def device_for(self, local_rank: int) -> str:
        """The device a local rank trains on ("cpu" or "cuda:N", N the real GPU index)."""
        if self.accelerator == "cpu":
            return "cpu"
        gpus = self.devices
        return f"cuda:{gpus[local_rank % len(gpus)]}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def copy(self) -> "RunConfig":
        return from_dict(self.to_dict())


# ----------------------------------------------------------------------------- devices


def free_gpus_asked(devices) -> int | None:
    """N for `devices: free:N` (the N least used GPUs without other processes, picked at launch by
    engine.hardware.resolve_free_gpus)."""
    if isinstance(devices, str) and devices.startswith("free:") and devices[5:].isdigit():
        return int(devices[5:])
    return None


# ----------------------------------------------------------------------------- parsing


def _type_name(tp) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            list: "a list", dict: "a mapping"}.get(tp, getattr(tp, "__name__", str(tp)))


def _plain(value) -> str:
    """A value inside a sentence: strings bare (dp), lists as [0, 1], booleans as YAML says them."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(map(_plain, value)) + "]"
    return _said(value) if isinstance(value, bool) else str(value)


def _said(value) -> str:
    """A value as the user wrote it, in YAML's words rather than Python's."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, dict)):
        import yaml

        kind = "list" if isinstance(value, list) else "mapping"
        return f"the {kind} " + yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return str(value)


def _wrong_type(wanted: str, value) -> str:
    if value is None or value == "":
        return f"must be {wanted}; it is empty"
    return f"must be {wanted}, got {_said(value)}"


def _coerce(value, tp, path: str, problems: list):
    """Check one scalar against its declared type; YAML already gives us typed values."""
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _SCI_FLOAT.match(value.strip()):  # YAML 1.1 reads 1e-3 as a string
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif tp is list:
        if isinstance(value, list):
            return value
    elif tp is dict:
        if isinstance(value, dict):
            return value
    problems.append((path, _wrong_type(_type_name(tp), value)))
    return dataclasses.MISSING


def _build(cls, data, prefix: str, problems: list):
    hints = get_type_hints(cls)
    obj = cls()
    if data is None:
        return obj
    if not isinstance(data, dict):
        problems.append((prefix.rstrip("."), _wrong_type("a mapping of settings (key: value lines)", data)))
        return obj
    names = [f.name for f in fields(cls)]
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            guess = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{guess[0]}'?)" if guess else f" (known: {', '.join(names)})"
            problems.append((path, f"unknown key{hint}"))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            setattr(obj, key, _build(tp, value, path + ".", problems))
            continue
        origin = get_origin(tp)
        if origin is not None and type(None) in get_args(tp):  # Optional[...] is not used; keep simple
            tp = next(a for a in get_args(tp) if a is not type(None))
        if path == "slurm.time" and isinstance(value, int) and not isinstance(value, bool):
            problems.append((path, f"write the time limit in quotes, e.g. time: \"4:00:00\" (YAML reads H:MM:SS "
                                   f"unquoted as a number of seconds, here {value}; minutes too: \"60\")"))
            continue
        if path in ("script.args", "slurm.sbatch_args") and isinstance(value, str):  # a command line, as the form and a shell take it
            value = _split_command_line(value, path, problems)
            if value is None:
                continue
        got = _coerce(value, tp, path, problems)
        if got is not dataclasses.MISSING:
            setattr(obj, key, got)
    return obj


def _split_command_line(text: str, path: str, problems: list) -> list | None:
    """`--epochs 3 --name "a b"` split as a shell splits it (shlex); None (and a problem) when its
    quotes do not close."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as exc:
        problems.append((path, f"a command line or a list of arguments; {text!r}: {exc}"))
        return None


def build(data: dict | None, source: str | None = None, hw=None) -> tuple[RunConfig, list[tuple[str, str]]]:
    """The config `data` says, its types checked and `devices` normalized (devices: -1 made this
    host's GPUs when hw, an engine.hardware.Hardware, knows their count), and the problems found
    so far. Raises ConfigError for data that is not a config at all."""
    problems: list[tuple[str, str]] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "a preset " + _wrong_type("a mapping of settings (key: value lines)", data))],
                          source)
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        problems.append(("schema_version", f"this torchdeck reads version {SCHEMA_VERSION}, got {version!r}"))
        raise ConfigError(problems, source)
    cfg = _build(RunConfig, data, "", problems)
    if not problems:
        _normalize(cfg, problems)
    if not problems and hw is not None:
        resolve_all_gpus(cfg, hw)
    return cfg, problems


def from_dict(data: dict | None, source: str | None = None, hw=None) -> RunConfig:
    """Build a config and check it against the schema's own rules (hw: an engine.hardware.Hardware,
    or None: not checked against a host). Raises ConfigError listing every problem. The rules that
    need a strategy (processes per node, what each strategy requires) and the picking of free GPUs
    sit above the schema: engine.preflight.from_dict checks everything."""
    cfg, problems = build(data, source, hw)
    if not problems:
        problems.extend(validate(cfg, hw))
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _normalize(cfg: RunConfig, problems: list) -> None:
    """Turn Lightning-style `devices` into its canonical form for the accelerator."""
    script = kind_of(cfg).is_script
    if script:
        _normalize_script(cfg.script, problems)
    d = cfg.devices
    if cfg.accelerator == "cpu":
        if script and d == "auto":  # one process per usable core (torchrun's cpu)
            return
        if isinstance(d, bool) or not isinstance(d, int):
            problems.append(("devices", f"with accelerator cpu, devices is the number of processes; got {d!r}"))
        return
    if d == "all":  # -1 not yet resolved (hardware unknown); round-trips through YAML
        return
    if isinstance(d, str) and d.replace(" ", "").startswith("free:"):
        d = d.replace(" ", "")
        if not free_gpus_asked(d) or free_gpus_asked(d) < 1:
            problems.append(("devices", f"free:N asks for N free GPUs, N a whole number of 1 or more; got {cfg.devices!r}"))
        else:
            cfg.devices = d  # picked on the launching host (resolve_free_gpus)
        return
    if isinstance(d, str):
        try:
            d = [int(p) for p in d.replace(" ", "").split(",") if p != ""]
        except ValueError:
            problems.append(("devices", f"GPU indices like \"0,2\" expected, got {cfg.devices!r}"))
            return
    elif isinstance(d, int) and not isinstance(d, bool):
        if d == -1:
            d = "all"
        elif d >= 1:
            d = list(range(d))
        else:
            problems.append(("devices", f"must be at least 1 GPU, or -1 for all; got {d}"))
            return
    elif isinstance(d, list):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in d):
            problems.append(("devices", f"GPU indices must be integers, got {d!r}"))
            return
    else:
        problems.append(("devices", f"GPU indices (a list or \"0,2\"), a count, or -1; got {d!r}"))
        return
    cfg.devices = d


def _normalize_script(s: ScriptConfig, problems: list) -> None:
    """script.args and script.env's values as the strings a command line and an environment hold
    (YAML reads `3` as a number); anything else is named."""
    def text(value, path: str):
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, (str, int, float)):
            return str(value)
        problems.append((path, _wrong_type("a string", value)))
        return None

    s.args = [text(a, f"script.args[{i}]") for i, a in enumerate(s.args)]
    env = {}
    for key, value in s.env.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            problems.append(("script.env", f"environment names are letters, digits and _, got {key!r}"))
            continue
        env[key] = text(value, f"script.env.{key}")
    s.env = env


def resolve_all_gpus(cfg: RunConfig, hw) -> None:
    """devices: -1 means every GPU on this host; fix it to indices once the count is known."""
    if cfg.accelerator == "cuda" and cfg.devices == "all" and hw.gpu_count is not None:
        cfg.devices = list(range(hw.gpu_count))


def not_one_of(path: str, value, allowed) -> tuple[str, str]:
    """The problem of a value that is none of `allowed`, with the nearest one as a hint."""
    guess = difflib.get_close_matches(str(value), list(allowed), n=1)
    hint = f"; did you mean '{guess[0]}'?" if guess else ""
    return path, f"must be one of {', '.join(allowed)}; got {value!r}{hint}"


class _Problems(list):
    """(field, reason) pairs, with the two rules most fields share."""

    def choice(self, path, value, allowed) -> None:
        if value not in allowed:
            self.append(not_one_of(path, value, allowed))

    def at_least(self, path, value, low) -> None:
        if value < low:
            self.append((path, f"must be at least {low}, got {value}"))


def validate(cfg: RunConfig, hw=None) -> list[tuple[str, str]]:
    """The schema's rules: each field's own range, then combinations of fields (and of fields and
    this host, when hw is given). Returns (field, reason) pairs; empty means valid as far as the
    schema sees. engine.preflight.validate adds the rules that need the strategy."""
    p = _Problems()
    if kind_of(cfg).is_script:  # the loop's fields (model, data, train...) do not apply
        p.choice("accelerator", cfg.accelerator, ACCELERATORS)
        _nodes_rules(cfg, p)
        _restart_rules(cfg, p)
        _script_rules(cfg, p)
        _slurm_rules(cfg, p)
        _device_rules(cfg, hw, p)
        return list(p)
    for rules in (_names, _train_rules, _restart_rules, _optimizer_rules, _data_rules, _node_rules, _slurm_rules):
        rules(cfg, p)
    _device_rules(cfg, hw, p)
    _combination_rules(cfg, hw, p)
    return list(p)


def _script_rules(cfg: RunConfig, p: _Problems) -> None:
    """The script section's own rules (that it names a script at all is the strategy's check)."""
    s = cfg.script
    if s.local_rank_arg not in LOCAL_RANK_ARGS:
        p.append(("script.local_rank_arg", f'must be "" (env only, as torchrun), --local-rank or --local_rank; '
                                           f"got {s.local_rank_arg!r}"))
    if not s.stop_grace_s > 0:
        p.append(("script.stop_grace_s", f"must be a positive number of seconds, got {s.stop_grace_s}"))
    if s.path and s.module:
        p.append(combination(cfg, "script.module", "set script.path or script.module, not both "
                             "(torchrun: a script, or -m MODULE)", "script.path", "script.module"))
    if s.no_python and s.module:
        p.append(combination(cfg, "script.no_python", "no_python runs an executable: it cannot be used with "
                             "script.module", "script.no_python", "script.module"))
    if s.no_python and s.local_rank_arg:
        p.append(combination(cfg, "script.local_rank_arg", "local_rank_arg is added by torchdeck's python shim; "
                             "with no_python pass the rank from LOCAL_RANK yourself", "script.no_python",
                             "script.local_rank_arg"))

_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")  # sbatch --time's forms


def _slurm_rules(cfg: RunConfig, p: _Problems) -> None:
    """The slurm section: its values become #SBATCH lines, so one per line and in SLURM's forms."""
    s = cfg.slurm
    if not _SLURM_TIME.match(s.time.strip()):
        p.append(("slurm.time", f"must be a time limit as sbatch --time takes it (minutes, HH:MM:SS or "
                                f"D-HH:MM:SS), got {s.time!r}"))
    p.at_least("slurm.gpus_per_node", s.gpus_per_node, 0)
    for name in ("partition", "account", "qos", "constraint"):
        value = getattr(s, name)
        if any(c.isspace() for c in value):
            p.append((f"slurm.{name}", f"must be one word (no spaces or line breaks), got {value!r}"))
    for i, arg in enumerate(s.sbatch_args):
        if not isinstance(arg, str) or not arg.startswith("-") or "\n" in arg:
            p.append((f"slurm.sbatch_args[{i}]", f"must be an sbatch option such as --mem=64G, one a list item; "
                                                 f"got {arg!r}"))


def _names(cfg: RunConfig, p: _Problems) -> None:
    """Names that must be one of a list (or a module:callable)."""
    p.choice("accelerator", cfg.accelerator, ACCELERATORS)
    p.choice("backend", cfg.backend, BACKENDS)
    p.choice("train.precision", cfg.train.precision, PRECISIONS)
    p.choice("optimizer.name", cfg.optimizer.name, OPTIMIZERS)
    p.choice("scheduler.name", cfg.scheduler.name, SCHEDULERS)
    p.choice("fsdp.state_dict", cfg.fsdp.state_dict, ("full", "sharded"))
    p.choice("deepspeed.offload_optimizer", cfg.deepspeed.offload_optimizer, OFFLOAD)
    p.choice("deepspeed.offload_param", cfg.deepspeed.offload_param, OFFLOAD)
    if cfg.model.name not in BUILTIN_MODELS and not _IMPORT_PATH.match(cfg.model.name):
        p.append(("model.name", f"must be one of {', '.join(BUILTIN_MODELS)} or 'package.module:callable'; got {cfg.model.name!r}"))
    if cfg.data.dataset not in BUILTIN_DATASETS and not _IMPORT_PATH.match(cfg.data.dataset):
        p.append(("data.dataset", f"must be one of {', '.join(BUILTIN_DATASETS)} or 'package.module:callable'; got {cfg.data.dataset!r}"))
    if cfg.train.loss not in LOSSES and not _IMPORT_PATH.match(cfg.train.loss):
        guess = difflib.get_close_matches(str(cfg.train.loss), LOSSES, n=1)
        hint = f"; did you mean '{guess[0]}'?" if guess else ""
        p.append(("train.loss", f"must be one of {', '.join(LOSSES)} or 'package.module:callable'; "
                                f"got {cfg.train.loss!r}{hint}"))
    if not re.match(r"^(env://|tcp://[^:/]+:\d+|file://.+)$", cfg.init_method):
        p.append(("init_method", f"must be env://, tcp://HOST:PORT or file:///PATH; got {cfg.init_method!r}"))
    if cfg.model.name == "gpt":  # its sizes (model.kwargs of the same names are checked when it is built)
        m = cfg.model
        for f in ("n_layer", "n_head", "n_embd", "block_size"):
            p.at_least(f"model.{f}", getattr(m, f), 1)
        if m.n_head >= 1 and m.n_embd % m.n_head:
            p.append(("model.n_embd", f"must be a multiple of model.n_head ({m.n_head}), got {m.n_embd}"))


def _train_rules(cfg: RunConfig, p: _Problems) -> None:
    t = cfg.train
    p.at_least("train.batch_size", t.batch_size, 1)
    p.at_least("train.epochs", t.epochs, 0)
    p.at_least("train.max_steps", t.max_steps, 0)
    if t.epochs == 0 and t.max_steps == 0:
        p.append(combination(cfg, "train.epochs", "epochs and max_steps are both 0: nothing to train; set one of them",
                             "train.epochs", "train.max_steps"))
    p.at_least("train.grad_accum", t.grad_accum, 1)
    if t.grad_clip < 0:
        p.append(("train.grad_clip", f"must be 0 (off) or positive, got {t.grad_clip}"))
    p.at_least("train.log_every_n_steps", t.log_every_n_steps, 1)
    p.at_least("train.threads_per_rank", t.threads_per_rank, 0)
    p.choice("train.cpu_affinity", t.cpu_affinity, CPU_AFFINITY)
    if t.report_every_s < 0:
        p.append(("train.report_every_s", f"must be 0 (off) or a number of seconds, got {t.report_every_s}"))


def _restart_rules(cfg: RunConfig, p: _Problems) -> None:
    """train.max_restarts (every kind). One node only: a restart of several nodes needs every node
    to stop and meet again together, which torchdeck's static rendezvous does not do."""
    p.at_least("train.max_restarts", cfg.train.max_restarts, 0)
    if cfg.train.max_restarts > 0 and cfg.nodes.num_nodes > 1:
        p.append(combination(cfg, "train.max_restarts", "restarts are for one node: several nodes would all have "
                             "to restart together, which torchdeck does not do yet; use one node, or no restarts "
                             "(resume a failed run with torchdeck resume)",
                             "train.max_restarts", "nodes.num_nodes"))


def _optimizer_rules(cfg: RunConfig, p: _Problems) -> None:
    o = cfg.optimizer
    if not o.lr > 0:
        p.append(("optimizer.lr", f"must be positive, got {o.lr}"))
    if not 0 <= o.momentum < 1:
        p.append(("optimizer.momentum", f"must be in [0, 1), got {o.momentum}"))
    if o.nesterov and (o.name != "sgd" or o.momentum == 0):
        p.append(combination(cfg, "optimizer.nesterov", "nesterov needs optimizer sgd with momentum > 0",
                             "optimizer.nesterov", "optimizer.name", "optimizer.momentum"))
    if o.weight_decay < 0:
        p.append(("optimizer.weight_decay", f"must be 0 or positive, got {o.weight_decay}"))
    if len(o.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in o.betas):
        p.append(("optimizer.betas", f"must be two numbers in [0, 1), got {o.betas!r}"))
    s = cfg.scheduler
    p.at_least("scheduler.step_size", s.step_size, 1)
    if not 0 < s.gamma <= 1:
        p.append(("scheduler.gamma", f"must be in (0, 1], got {s.gamma}"))
    p.at_least("scheduler.warmup_steps", s.warmup_steps, 0)
    if s.name == "warmup" and s.warmup_steps == 0:
        p.append(combination(cfg, "scheduler.warmup_steps", "scheduler warmup needs warmup_steps > 0",
                             "scheduler.name", "scheduler.warmup_steps"))


def _data_rules(cfg: RunConfig, p: _Problems) -> None:
    """Data loading and checkpoints."""
    d = cfg.data
    if d.num_workers < -1:
        p.append(("data.num_workers", f"must be -1 (auto) or a number of loader processes, got {d.num_workers}"))
    p.at_least("data.prefetch_factor", d.prefetch_factor, 1)
    p.choice("data.cache", d.cache, CACHE_MODES)
    p.choice("data.worker_start", d.worker_start, WORKER_STARTS)
    if d.worker_start in ("fork", "forkserver") and sys.platform == "win32":
        p.append(("data.worker_start", f"{d.worker_start} is not available on Windows; use auto or spawn"))
    p.choice("data.augment", d.augment, AUGMENTS)
    p.at_least("data.cache_budget_mb", d.cache_budget_mb, 0)
    if d.dataset == "synthetic":
        p.at_least("data.train_size", d.train_size, 1)
        p.at_least("data.val_size", d.val_size, 0)
        p.at_least("data.num_classes", d.num_classes, 2)
        p.at_least("data.image_size", d.image_size, 8)
    if d.dataset == "imagefolder" and not d.root:
        p.append(("data.root", "imagefolder needs data.root pointing at a folder of class sub-folders"))
    if cfg.model.name == "cnn" and d.dataset in ("synthetic", "imagefolder") and d.image_size < CNN_MIN_IMAGE:
        p.append(combination(cfg, "data.image_size", f"model cnn needs images of at least {CNN_MIN_IMAGE} px; "
                             "raise data.image_size or use model mlp or resnet18", "model.name", "data.image_size"))
    c = cfg.checkpoint
    p.at_least("checkpoint.every_n_steps", c.every_n_steps, 0)
    p.at_least("checkpoint.keep_last", c.keep_last, 1)


def _node_rules(cfg: RunConfig, p: _Problems) -> None:
    """Nodes, and the per-strategy sections' own ranges."""
    _nodes_rules(cfg, p)
    p.at_least("ddp.bucket_cap_mb", cfg.ddp.bucket_cap_mb, 1)
    p.at_least("model_parallel.micro_batches", cfg.model_parallel.micro_batches, 1)


def _nodes_rules(cfg: RunConfig, p: _Problems) -> None:
    """The nodes section (every strategy, the user's script too)."""
    n = cfg.nodes
    p.at_least("nodes.num_nodes", n.num_nodes, 1)
    if not 0 <= n.node_rank < max(n.num_nodes, 1):
        p.append(("nodes.node_rank", f"must be in 0..{n.num_nodes - 1} for {n.num_nodes} node(s), got {n.node_rank}"))
    if not 0 <= n.master_port <= 65535:
        p.append(("nodes.master_port", f"must be a port number 1-65535 (0: pick a free one), got {n.master_port}"))
    if n.master_port == 0 and n.num_nodes > 1:
        p.append(combination(cfg, "nodes.master_port", "multi-node runs need a fixed master_port that every node uses",
                             "nodes.num_nodes", "nodes.master_port"))
    p.at_least("nodes.timeout_s", n.timeout_s, 1)
    bad_addr = host_problem(n.master_addr)
    if bad_addr:
        p.append(("nodes.master_addr", f"must be node 0's host name or IPv4/IPv6 address (127.0.0.1 on one "
                                       f"machine); {n.master_addr!r} {bad_addr}"))


def _device_rules(cfg: RunConfig, hw, p: _Problems) -> None:
    """Devices as this host has them (hw None: checked without a host, e.g. for another node)."""
    if cfg.accelerator == "cpu" and isinstance(cfg.devices, int):
        p.at_least("devices", cfg.devices, 1)
    if cfg.accelerator == "cuda" and isinstance(cfg.devices, list):
        if not cfg.devices:
            p.append(("devices", "pick at least one GPU"))
        # a GPU listed twice is the strategy's to refuse (model-parallel may put two stages on one)
        if any(i < 0 for i in cfg.devices):
            p.append(("devices", f"GPU indices are 0 or more, got {cfg.devices}"))
        if hw is not None and hw.gpu_count is not None:
            missing = [i for i in cfg.devices if i >= hw.gpu_count]
            if missing:
                have = f"GPUs 0-{hw.gpu_count - 1}" if hw.gpu_count else "no GPU"
                p.append(("devices", f"GPU {', '.join(map(str, missing))} does not exist: this host has {have}"))
    if cfg.accelerator == "cuda" and hw is not None and hw.gpu_count == 0:
        p.append(("accelerator", "cuda needs an NVIDIA GPU and driver, and this host has none; use accelerator cpu"))


def _combination_rules(cfg: RunConfig, hw, p: _Problems) -> None:
    """Settings each fine alone that do not go together (or not on this host)."""
    if cfg.backend == "nccl" and cfg.accelerator != "cuda":
        p.append(combination(cfg, "backend", "nccl needs CUDA GPUs; use gloo for CPU processes", "backend", "accelerator"))
    if cfg.backend == "mpi" and hw is not None and hw.mpi_available is False:
        p.append(("backend", "this PyTorch build has no MPI support (`torchdeck env` says mpi False); use gloo "
                             "for CPU processes or nccl for GPUs, or a PyTorch built from source with MPI"))
    if cfg.train.precision == "16-mixed" and cfg.accelerator == "cpu":
        p.append(combination(cfg, "train.precision", "fp16 mixed precision needs CUDA; on CPU use bf16-mixed or 32-true",
                             "train.precision", "accelerator"))
    if cfg.data.on_device and cfg.accelerator != "cuda":
        p.append(combination(cfg, "data.on_device", "keeping data on the device needs accelerator cuda",
                             "data.on_device", "accelerator"))
    if cfg.data.pin_memory and cfg.accelerator != "cuda":
        p.append(combination(cfg, "data.pin_memory", "pinned memory only helps copies to a GPU; turn it off for CPU runs",
                             "data.pin_memory", "accelerator"))


# ----------------------------------------------------------------------------- YAML


# PyYAML is imported where YAML is read or written, not with this module: its import (~7 ms, most
# of it one regex) is on the app's first frame otherwise, and a preset the app opened before is
# read from its JSON copy (load(..., cache=True)).


def _yaml_error(exc) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"broken YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return "broken YAML: " + " ".join(str(problem).split())  # one line (a ReaderError spans two)


def _parse(text: str, source: str | None) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([("", _yaml_error(exc))], source) from None


def parse(text: str, source: str | None = None) -> Any:
    """What a preset's YAML text says (not yet checked as a config)."""
    return _parse(text, source)


def read(path: str | os.PathLike, cache: bool = False) -> Any:
    """What a preset file says (not yet checked as a config). cache: keep what the file parsed to
    as JSON (under the user's cache directory) and read that while the file's text is unchanged.
    For the app's start-up only: it saves PyYAML's import."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([("", "no such preset file; `torchdeck presets` lists the known ones")], str(path)) from None
    except OSError as exc:
        raise ConfigError([("", f"cannot read the preset: {exc.strerror}")], str(path)) from None
    return _parse_cached(path, text) if cache else _parse(text, str(path))


def loads(text: str, source: str | None = None, hw=None) -> RunConfig:
    """The schema's check only (engine.preflight.loads checks everything)."""
    return from_dict(_parse(text, source), source=source, hw=hw)


def load(path: str | os.PathLike, hw=None, cache: bool = False) -> RunConfig:
    """The schema's check only (engine.preflight.load checks everything); cache: see `read`."""
    return from_dict(read(path, cache), source=str(path), hw=hw)


def cache_dir() -> Path:
    base = os.environ.get("TORCHDECK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchdeck")
    return Path(base)


def _parse_cached(path: Path, text: str) -> Any:
    """The parsed file from its JSON copy when that copy was made from this very text; else parse
    it and write the copy (only when JSON gives back exactly what YAML gave: no dates, no int keys).
    A copy that cannot be read or written is ignored: the YAML file stays the truth."""
    import json
    import zlib

    where = str(path.resolve())
    copy = cache_dir() / "presets" / f"{zlib.crc32(where.encode()):08x}.json"
    try:
        kept = json.loads(copy.read_text())
        if kept.get("path") == where and kept.get("text") == text:
            return kept["data"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    data = _parse(text, str(path))
    try:
        blob = json.dumps({"path": where, "text": text, "data": data})
        if json.loads(blob)["data"] == data:
            copy.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(copy, blob)
    except (OSError, TypeError, ValueError):
        pass
    return data


_DUMPER = None


def _dumper():
    """The shipped presets' style: mappings as indented blocks, lists inline (`devices: [0, 1]`)."""
    global _DUMPER
    if _DUMPER is None:
        import yaml

        class Dumper(yaml.SafeDumper):
            pass

        Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
        _DUMPER = Dumper
    return _DUMPER


def changes(cfg: RunConfig) -> dict:
    """What differs from the defaults, in schema order, with schema_version and name always kept:
    a preset a person can read at a glance."""
    def diff(now: dict, default: dict) -> dict:
        out = {}
        for key, value in now.items():
            if isinstance(value, dict) and isinstance(default.get(key), dict) and key != "kwargs":
                sub = diff(value, default[key])
                if sub:
                    out[key] = sub
            elif value != default.get(key):
                out[key] = value
        return out

    data = cfg.to_dict()
    return {"schema_version": data["schema_version"], "name": data["name"],
            **diff(data, RunConfig().to_dict())}


def dumps(cfg: RunConfig, changes_only: bool = False) -> str:
    """YAML of the whole config (what a run holds), or of its changes from the defaults (a preset)."""
    data = changes(cfg) if changes_only else cfg.to_dict()
    import yaml

    return yaml.dump(data, Dumper=_dumper(), sort_keys=False, default_flow_style=False, allow_unicode=True)


def save(cfg: RunConfig, path: str | os.PathLike, changes_only: bool = False) -> None:
    """Write atomically: a crash mid-write never leaves a half preset behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dumps(cfg, changes_only), durable=True)


# --set values kept as the text given: YAML reads slurm.time=4:00:00 as the number 14400 (base 60)
AS_WRITTEN = ("slurm.time",)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`--set train.lr=0.1 devices=0,1`: values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError([("", f"--set expects key=value, got {item!r}")])
        key, raw = item.split("=", 1)
        import yaml

        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if key.strip() in AS_WRITTEN:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return data
