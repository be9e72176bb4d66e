"""Which form field edits which RunConfig setting, how its text maps to a value, and when it shows.

Derived from the RunConfig dataclasses, so a setting added to the schema gets a field without
touching the form; the tables below only add labels, choices, groups and visibility rules.
No textual here: the form widgets and the tests both use it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, get_type_hints

from ...engine import config as C
from ...engine import strategies
from ...engine.kinds import kind_of

CUSTOM = "__custom__"  # Select value meaning "a package.module:callable typed below"

GROUPS = ("Essentials", "Where", "Run", "Distributed", "Model & data", "Optimization", "Precision & speed",
          "Checkpoints", "Strategy options", "SLURM options")

# Form-only fields: what the form asks that is no RunConfig setting. "where" says what F5 does with
# the config (start it on this host, or submit it to SLURM); it is never part of the config itself.
WHERE = "where"
WHERE_CHOICES = ("host", "slurm")
CHOICE_LABELS = {"host": "this host", "slurm": "SLURM"}

# What most runs change, first on screen and in this order; every other setting keeps schema order
# inside its section.
ESSENTIALS = ("strategy", "accelerator", "devices", "model.name", "data.dataset", "train.batch_size",
              "optimizer.lr", "train.epochs", "train.precision")

# path prefix (or exact path) -> group; first match wins
_GROUP_OF = [
    ("nodes.num_nodes", "Where"), ("slurm.partition", "Where"), ("slurm.time", "Where"),
    ("slurm.", "SLURM options"),
    ("backend", "Distributed"), ("init_method", "Distributed"), ("nodes.", "Distributed"),
    ("train.precision", "Precision & speed"), ("train.threads_per_rank", "Precision & speed"),
    ("train.cpu_affinity", "Precision & speed"),
    ("train.channels_last", "Precision & speed"), ("train.compile", "Precision & speed"),
    ("train.cudnn_benchmark", "Precision & speed"), ("train.tf32", "Precision & speed"),
    ("train.deterministic", "Precision & speed"),
    ("model.", "Model & data"), ("data.", "Model & data"),
    ("optimizer.", "Optimization"), ("scheduler.", "Optimization"), ("train.", "Optimization"),
    ("checkpoint.", "Checkpoints"),
] + [(f"{s}.", "Strategy options") for s in dict.fromkeys(  # each strategy's own section
    strategies.get_strategy(n).section for n in strategies.loop_names()) if s]

CHOICES: dict[str, tuple] = {
    "strategy": tuple(strategies.names()), "accelerator": C.ACCELERATORS, "backend": C.BACKENDS,
    "train.precision": C.PRECISIONS, "optimizer.name": C.OPTIMIZERS, "scheduler.name": C.SCHEDULERS,
    "model.name": C.BUILTIN_MODELS + (CUSTOM,), "data.dataset": C.BUILTIN_DATASETS + (CUSTOM,),
    "fsdp.state_dict": ("full", "sharded"),
    "deepspeed.offload_optimizer": C.OFFLOAD, "deepspeed.offload_param": C.OFFLOAD,
    "data.cache": C.CACHE_MODES, "data.augment": C.AUGMENTS, "train.cpu_affinity": C.CPU_AFFINITY,
    "data.worker_start": C.WORKER_STARTS, WHERE: WHERE_CHOICES,
}

LABELS = {
    "init_method": "init method", "nodes.num_nodes": "nodes", "nodes.node_rank": "node rank",
    "nodes.master_addr": "master address", "nodes.master_port": "master port (0: free)",
    "nodes.timeout_s": "timeout (s)", "nodes.ifname": "network interface",
    "train.batch_size": "batch size", "train.max_steps": "max steps (0: none)",
    "train.grad_accum": "grad accumulation", "train.grad_clip": "grad clip (0: off)",
    "train.log_every_n_steps": "log every n steps", "train.threads_per_rank": "threads/rank (0: auto)",
    "train.report_every_s": "rank report (s, 0: off)", "train.cpu_affinity": "cores per rank",
    "checkpoint.dir": "checkpoint dir", "checkpoint.every_n_steps": "every n steps (0: off)",
    "checkpoint.resume": "resume (latest|path)", "optimizer.name": "optimizer", "scheduler.name": "scheduler",
    "model.name": "model", "data.dataset": "dataset", "data.root": "data root",
    "data.cache": "decode once (cache)", "data.cache_budget_mb": "cache MiB (0: RAM/4)",
    "data.num_workers": "workers/rank (-1: auto)", "data.worker_start": "workers start by",
    "deepspeed.stage": "ZeRO stage", "deepspeed.offload_optimizer": "offload optimizer",
    "deepspeed.offload_param": "offload parameters", "deepspeed.config": "your ds_config.json",
    "script.path": "script", "script.module": "or module (-m)", "script.args": "arguments",
    "script.no_python": "no python (exe)", "script.local_rank_arg": "local rank arg",
    "script.env": "environment", "script.stop_grace_s": "stop grace (s)", "script.cwd": "run in folder",
    WHERE: "where", "slurm.time": "time limit", "slurm.gpus_per_node": "GPUs per node (0: auto)",
    "slurm.sbatch_args": "more sbatch options",
}

HINTS = {
    "model.name": "custom: package.module:callable",
    "data.dataset": "custom: package.module:callable",
    "model.kwargs": "YAML mapping passed to the callable, e.g. {depth: 4}",
    "optimizer.betas": "two numbers, e.g. 0.9, 0.999",
    "model_parallel.split": "layers per device, e.g. 3, 4 (empty: balance by parameters)",
    "init_method": "env://, tcp://HOST:PORT or file:///PATH",
    "nodes.ifname": "NIC for gloo/NCCL, e.g. eth0 (empty: they pick one)",
    "train.report_every_s": "how often rank 0 gathers all ranks' progress",
    "data.cache": "auto: keep decoded images in RAM when they fit the budget",
    "train.cpu_affinity": "auto: each CPU rank on cores of its own",
    "data.cache_budget_mb": "for all ranks of this node together",
    "data.augment": "random crop (padding size/8) and/or horizontal flip, per batch",
    "data.worker_start": "auto: from a fork server (torch imported once)",
    "deepspeed.stage": "0: plain data parallel; 1: optimizer state sharded; 2: + gradients; 3: + parameters",
    "deepspeed.config": "path (empty: generated); its values win, the run lists each one it replaces",
    "script.path": "train.py, in the folder below (empty: a module)",
    "script.module": "python -m MODULE instead of a path",
    "script.args": "as on a command line: --epochs 3 --lr 0.1",
    "script.local_rank_arg": "empty: env (torchrun); --local-rank: old launch",
    "script.env": "K=V K2=V2 for every rank",
    "script.stop_grace_s": "stop: SIGTERM, then SIGKILL after this",
    "script.cwd": "empty: where torchdeck was started",
    "slurm.time": "HH:MM:SS or D-HH:MM:SS, as sbatch --time",
    "slurm.gpus_per_node": "0: the ranks per node under cuda, none on cpu",
    "slurm.sbatch_args": "as on a command line: --mail-type=END --exclusive",
}


def _custom_model(v) -> bool:
    return v("model.name") not in C.BUILTIN_MODELS


def _script(v) -> bool:
    """A run of the user's own script (torchdeck launch), not torchdeck's loop."""
    return kind_of(v("strategy")).is_script


def _strategy(v):
    """The strategy the form names, or None while it names none."""
    return strategies.get_strategy(v("strategy")) if strategies.known(v("strategy")) else None


def _distributed(v) -> bool:
    """Torchdeck's loop over a process group: backend and init_method apply."""
    s = _strategy(v)
    return s is not None and s.distributed and not _script(v)


def _slurm(v) -> bool:
    """The form is to be submitted to SLURM (its where choice)."""
    return v(WHERE) == "slurm"


def _section_of_strategy(section: str) -> Callable:
    """Shown while the strategy is one whose own section this is (ddp.: ddp's and zero's)."""
    return lambda v: (_strategy(v) or strategies.Strategy).section == section


def _spans_nodes(v) -> bool:
    """Ranks on several nodes: a distributed strategy's, or a script's (torchrun's node flags)."""
    return _distributed(v) or _script(v)


# path -> predicate over a value getter; a field with an error shows whatever this says
_SHOWN_WHEN: dict[str, Callable] = {
    "backend": _distributed,
    "init_method": _distributed,
    "model.small_stem": lambda v: v("model.name") == "resnet18",
    "model.hidden": lambda v: v("model.name") == "mlp",
    "model.n_layer": lambda v: v("model.name") == "gpt",
    "model.n_head": lambda v: v("model.name") == "gpt",
    "model.n_embd": lambda v: v("model.name") == "gpt",
    "model.block_size": lambda v: v("model.name") == "gpt" or v("data.dataset") == "text",
    "model.kwargs": _custom_model,
    "data.root": lambda v: v("data.dataset") != "synthetic",
    "data.download": lambda v: v("data.dataset") in ("cifar10", "mnist", "fashionmnist"),
    "data.cache": lambda v: v("data.dataset") in ("cifar10", "mnist", "fashionmnist", "imagefolder"),
    "data.cache_budget_mb": lambda v: v("data.dataset") in ("cifar10", "mnist", "fashionmnist", "imagefolder"),
    "data.on_device": lambda v: v("accelerator") == "cuda",
    "data.pin_memory": lambda v: v("accelerator") == "cuda",
    "data.worker_start": lambda v: v("data.dataset") != "synthetic" and v("data.num_workers") != 0,
    "optimizer.momentum": lambda v: v("optimizer.name") == "sgd",
    "optimizer.nesterov": lambda v: v("optimizer.name") == "sgd",
    "optimizer.betas": lambda v: v("optimizer.name") in ("adam", "adamw"),
    "scheduler.step_size": lambda v: v("scheduler.name") == "step",
    "scheduler.gamma": lambda v: v("scheduler.name") == "step",
    "scheduler.warmup_steps": lambda v: v("scheduler.name") in ("warmup", "cosine", "onecycle"),
    "scheduler.min_lr": lambda v: v("scheduler.name") == "cosine",
    # one node is always node 0; a count still being typed (not a number) shows it
    # under SLURM the node count is the job's, and SLURM says each node's rank and the master
    "nodes.num_nodes": lambda v: _spans_nodes(v) or _slurm(v),
    "nodes.node_rank": lambda v: _spans_nodes(v) and v("nodes.num_nodes") != 1 and not _slurm(v),
    "nodes.master_addr": lambda v: _spans_nodes(v) and not _slurm(v),
    # parameters offload only under stage 3; a stage still being typed shows it
    "deepspeed.offload_param": lambda v: _section_of_strategy("deepspeed")(v)
    and v("deepspeed.stage") not in (0, 1, 2),
}
_PREFIX_SHOWN_WHEN = {
    "nodes.": lambda v: _spans_nodes(v),
    "slurm.": lambda v: _slurm(v),
    **{f"{s}.": _section_of_strategy(s) for s in  # a strategy's own section (script.: the user's script)
       dict.fromkeys(strategies.get_strategy(n).section for n in strategies.names()) if s},
}
# What torchdeck's own loop reads, and a script run (strategy script) does not: hidden there, so the
# form of a script run is its script, processes, nodes and environment. threads/rank stays: it is
# each rank's OMP_NUM_THREADS.
_LOOP_ONLY = ("model.", "data.", "optimizer.", "scheduler.", "train.", "checkpoint.", "nodes.timeout_s",
              "nodes.ifname")
_SCRIPT_USES = ("train.threads_per_rank",)
# a script's arguments and environment are typed as on a command line (shell words), not as YAML
_WORD_KINDS = {"script.args": "argv", "script.env": "env", "slurm.sbatch_args": "argv"}
for _name in ("train_size", "val_size", "num_classes", "image_size"):
    _SHOWN_WHEN[f"data.{_name}"] = lambda v: v("data.dataset") == "synthetic"


@dataclass(frozen=True)
class Field:
    path: str  # dotted RunConfig path
    kind: str  # choice | int | float | str | bool | list | mapping | devices
    group: str
    label: str
    choices: tuple = ()
    hint: str = ""
    schema: bool = True  # a RunConfig setting (False: the form's own, as where)

    @property
    def wid(self) -> str:
        """Widget id: dots are not allowed in ids."""
        return "f-" + self.path.replace(".", "-")

    def shown(self, value_of: Callable[[str], Any]) -> bool:
        if (self.path.startswith(_LOOP_ONLY) and self.path not in _SCRIPT_USES
                and _script(value_of)):
            return False
        rule = _SHOWN_WHEN.get(self.path)
        if rule is None:
            rule = next((r for p, r in _PREFIX_SHOWN_WHEN.items() if self.path.startswith(p)), None)
        return True if rule is None else bool(rule(value_of))


def _group(path: str) -> str:
    if path in ESSENTIALS:
        return "Essentials"
    for prefix, group in _GROUP_OF:
        if path == prefix or (prefix.endswith(".") and path.startswith(prefix)):
            return group
    return "Run"


def _kind(path: str, tp) -> str:
    if path == "devices":
        return "devices"
    if path == "slurm.partition":
        return "partition"  # a choice whose choices sinfo gives
    if path in CHOICES:
        return "choice"
    if path in _WORD_KINDS:
        return _WORD_KINDS[path]
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "mapping"}.get(tp, "str")


def _walk(cls, prefix=""):
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = prefix + f.name
        if dataclasses.is_dataclass(tp):
            yield from _walk(tp, path + ".")
        else:
            yield path, tp


def all_fields() -> list[Field]:
    """Every RunConfig leaf except schema_version, and the form's own fields, in group order then
    schema order."""
    out = [Field(WHERE, "choice", "Where", LABELS[WHERE], WHERE_CHOICES, schema=False)]
    for path, tp in _walk(C.RunConfig):
        if path == "schema_version":
            continue
        label = LABELS.get(path, path.rsplit(".", 1)[-1].replace("_", " "))
        out.append(Field(path, _kind(path, tp), _group(path), label, CHOICES.get(path, ()), HINTS.get(path, "")))
    order = {g: i for i, g in enumerate(GROUPS)}
    first = {p: i for i, p in enumerate(ESSENTIALS)}
    return sorted(out, key=lambda f: (order[f.group], first.get(f.path, 0)))  # stable: schema order inside a group


FIELDS = all_fields()
BY_PATH = {f.path: f for f in FIELDS}


# ----------------------------------------------------------------------------- text <-> value


def format_value(kind: str, value) -> str:
    """What an Input shows for a config value."""
    if kind == "list":
        return ", ".join(str(x) for x in value) if isinstance(value, list) else str(value)
    if kind == "argv":
        import shlex

        return shlex.join(str(x) for x in value) if isinstance(value, list) else str(value)
    if kind == "env":
        import shlex

        return (" ".join(f"{k}={shlex.quote(str(v))}" for k, v in value.items()) if isinstance(value, dict)
                else str(value))
    if kind == "mapping":
        import yaml  # here, not at import: PyYAML's import is not on the first frame

        return "" if value in ({}, None) else yaml.safe_dump(value, default_flow_style=True).strip()
    if kind == "devices":  # cuda indices typed by hand (no GPU list)
        if isinstance(value, list):
            return ",".join(str(i) for i in value)
        return "all" if value == "all" else str(value)
    return "" if value is None else str(value)


def parse_text(kind: str, text: str):
    """Text to a config value; text that does not parse is returned as is, so validation names it."""
    if kind in ("argv", "env"):
        return _words(kind, text)
    import yaml

    t = text.strip()
    try:
        if kind == "int":
            return int(t)
        if kind == "float":
            return float(t)
        if kind == "list":
            got = yaml.safe_load(f"[{t}]")
            return got if isinstance(got, list) else text
        if kind == "mapping":
            got = yaml.safe_load(t) if t else {}
            return got if got is not None else {}
        if kind == "devices":
            if t.lower() in ("all", "-1"):
                return "all"
            return [int(p) for p in t.replace(" ", "").split(",") if p != ""]
    except (ValueError, yaml.YAMLError):
        return text
    return text


def _words(kind: str, text: str):
    """Shell words: a list (argv) or K=V pairs (env); text that does not split is kept, for
    validation to name."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError:  # an unclosed quote
        return text
    if kind == "argv":
        return words
    if not all("=" in w and w.split("=", 1)[0] for w in words):
        return text
    return dict(w.split("=", 1) for w in words)


def set_path(d: dict, path: str, value) -> None:
    parts = path.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def get_path(d: dict, path: str, default=None):
    for p in path.split("."):
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        leaf = BY_PATH.get(prefix + k)  # a mapping setting (model.kwargs, script.env) is one value
        if isinstance(v, dict) and k not in ("kwargs",) and (leaf is None or leaf.kind not in ("mapping", "env")):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def override_text(value) -> str:
    """A value as `--set key=VALUE` text that engine.config.apply_overrides reads back equal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        import yaml

        try:
            same = yaml.safe_load(value) == value if value else False
        except yaml.YAMLError:
            same = False
        return value if same else json.dumps(value)
    return json.dumps(value, default=str)
