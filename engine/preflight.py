"""What is checked before a run starts, for every way of starting one: `torchdeck run`, Launch in
the app, `torchdeck validate`. The schema (engine.config) checks a config on its own; this adds
the rules that need its strategy (asked through engine.strategies: processes per node, what each
strategy requires), devices: free:N picked on this host (engine.hardware), and what needs the
file system and this host: data roots, the resume file, a user's `module:callable`, network
interfaces. One list of problems, the same words everywhere.
No torch here (the app calls it on its event loop).
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
from pathlib import Path

from . import config as cfgmod
from . import strategies
from .kinds import kind_of

Problem = tuple[str, str]  # (field path, what is wrong and what to do)


# ----------------------------------------------------------------------------- the whole config


def validate(cfg, hw=None) -> list[Problem]:
    """Every rule that needs no torch (hw: an engine.hardware.Hardware, or None: no host). The
    schema's rules and those that need the processes per node first, then the strategy's own
    (only for a config whose fields are each fine: its rules may assume them). Empty: valid."""
    known = strategies.known(cfg.strategy)
    p = [] if known else [cfgmod.not_one_of("strategy", cfg.strategy, strategies.names())]
    p += cfgmod.validate(cfg, hw) + _per_node_rules(cfg, hw)
    if not p and known:
        p.extend(strategies.get_strategy(cfg.strategy).check(cfg, hw))
    return p


def _per_node_rules(cfg, hw) -> list[Problem]:
    t = cfg.train
    if t.cpu_affinity != "exclusive" or hw is None or not strategies.known(cfg.strategy):
        return []
    local = strategies.nproc_per_node(cfg)
    need = local * (t.threads_per_rank or 1)
    if need <= hw.cpu_count:
        return []
    why = (f"exclusive needs {local} rank(s) x {t.threads_per_rank or 1} thread(s) = {need} cores of their own; "
           f"this host has {hw.cpu_count}: lower train.threads_per_rank or the ranks per node, or use auto")
    return [cfgmod.combination(cfg, "train.cpu_affinity", why, "train.cpu_affinity", "strategy", "devices",
                               "train.threads_per_rank")]


def from_dict(data, source: str | None = None, hw=None):
    """A RunConfig checked by every rule (`validate`), devices: free:N picked on this host when hw
    has read its GPUs. Raises ConfigError listing every problem."""
    from .hardware import resolve_free_gpus

    cfg, problems = cfgmod.build(data, source, hw)
    if not problems and hw is not None:
        resolve_free_gpus(cfg, hw, problems)
    if not problems:
        problems.extend(validate(cfg, hw))
    if problems:
        raise cfgmod.ConfigError(problems, source)
    return cfg


def loads(text: str, source: str | None = None, hw=None):
    return from_dict(cfgmod.parse(text, source), source=source, hw=hw)


def load(path, hw=None, cache: bool = False):
    """A preset file checked by every rule; cache: see engine.config.read."""
    return from_dict(cfgmod.read(path, cache), source=str(path), hw=hw)


def _is_loopback(host: str) -> bool:
    import ipaddress

    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advice(cfg) -> list[Problem]:
    """Valid but probably not meant: (field, why) pairs that validate and the form show as
    warnings and never refuse. Call it on a config that passed validation."""
    out: list[Problem] = []
    n = cfg.nodes
    if n.num_nodes > 1 and strategies.get_strategy(cfg.strategy).distributed:
        if cfg.init_method.startswith("tcp://"):
            field, host = "init_method", cfg.init_method[len("tcp://"):].rpartition(":")[0]
        else:
            field, host = "nodes.master_addr", n.master_addr
        if cfg.init_method.startswith(("env://", "tcp://")) and _is_loopback(host):
            # a warning, not an error: several nodes on one host is a fair rehearsal
            out.append((field, f"{host.strip()} is this host itself: nodes on other machines need "
                               "node 0's network address here"))
    crowded = cpu_ranks_advice(cfg)
    if crowded:
        out.append(("devices", crowded))
    return out


def cpu_ranks_advice(cfg, cores: int | None = None) -> str | None:
    """More CPU ranks than this process may use cores (affinity.usable_cpus): they take turns on
    the cores, and each holds its own model and data, so the run is slower than with fewer."""
    if cfg.accelerator != "cpu":
        return None
    from .affinity import usable_cpus

    ranks, cores = strategies.nproc_per_node(cfg), cores or usable_cpus()
    if ranks <= cores:
        return None
    from .cache import fmt_bytes, plan

    data = plan(cfg, ranks) if kind_of(cfg).loop_config else None  # a script's data is its own
    held = "" if data is None else (f", each with its own {fmt_bytes(data.nbytes)} of data ({fmt_bytes(data.node_bytes)} in all)"
            if data.nbytes and not data.shared else "")
    return (f"{ranks} CPU ranks on {cores} usable core{'s' if cores != 1 else ''}: they take turns on the "
            f"cores{held}; {cores} or fewer train faster")


# ----------------------------------------------------------------------------- how long a run is

def train_samples(cfg) -> int | None:
    """Training samples in the data set, where known without building it (None: a user's callable)."""
    if cfg.data.dataset == "synthetic":
        return cfg.data.train_size
    if cfg.data.dataset == "text":  # counted from the files' sizes, the text not read
        from .text import block_size_of, root_size, train_windows

        n = root_size(cfg.data.root)
        return train_windows(n, block_size_of(cfg)) if n else None
    from .cache import decoded_size

    size = decoded_size(cfg)  # torchvision's array sets, an image folder (counted)
    return size[0] if size else None


def steps_per_epoch(cfg, shards: int | None = None, samples: int | None = None) -> int | None:
    """Optimizer steps in one epoch, as a rank counts them: its share of the samples (the sampler
    drops the rest: samples // shards), whole micro-batches, grad_accum of them a step. `shards`:
    how many ranks split the data (default: the world size for a strategy that shards it, else 1)."""
    samples = train_samples(cfg) if samples is None else samples
    if samples is None:
        return None
    if shards is None:
        shards = strategies.world_size(cfg) if strategies.get_strategy(cfg.strategy).distributed else 1
    return samples // max(1, shards) // cfg.train.batch_size // cfg.train.grad_accum


class Length:
    """How long a run is, and which limit ends it: train.epochs x the steps in an epoch, or
    train.max_steps, whichever is reached first (the rule the trainer follows). The one place
    validate, run_started (the Monitor's epoch total) and rank 0's start-up line take it from."""

    def __init__(self, cfg, steps_per_epoch: int | None):
        self.epochs, self.max_steps = cfg.train.epochs, cfg.train.max_steps  # 0: no limit
        self.steps_per_epoch = steps_per_epoch  # None: not known before the data is built
        spe = self.steps_per_epoch
        by_epochs = self.epochs * spe if spe is not None and self.epochs else None
        if spe is None:
            self.total_steps = self.max_steps or None
            self.ends_by = "train.max_steps" if not self.epochs else ("train.epochs" if not self.max_steps else None)
        elif self.max_steps and (by_epochs is None or self.max_steps < by_epochs):
            self.total_steps, self.ends_by = self.max_steps, "train.max_steps"
        else:
            self.total_steps, self.ends_by = by_epochs, "train.epochs"
        # the 1-based epoch its last step is in: what "epoch 3/N" counts to
        self.end_epoch = -(-self.total_steps // spe) if spe and self.total_steps else (self.epochs or None)

    def fields(self) -> dict:
        """What run_started carries of it."""
        return {"total_steps": self.total_steps, "epochs": self.epochs, "end_epoch": self.end_epoch,
                "ends_by": self.ends_by, "steps_per_epoch": self.steps_per_epoch}

    def said(self) -> str:
        from .fmt import num

        e, m, spe = self.epochs, self.max_steps, self.steps_per_epoch
        n = lambda v: num(v, ",")  # noqa: E731
        if spe == 0:
            return ("no whole step in an epoch: a rank's share of the data is less than train.batch_size x "
                    "grad_accum, so the run would stop at once; lower the batch size or use more data")
        epochs = f"{e} epoch{'s' if e != 1 else ''}"
        if spe is None:
            if e and m:
                return (f"ends after {epochs} or at step {n(m)} (train.max_steps), whichever comes first "
                        "(steps per epoch are known once the data set is built)")
            return f"ends at step {n(m)} (train.max_steps)" if m else f"ends after {epochs} (train.epochs)"
        per = f"{epochs} x {n(spe)} step{'s' if spe != 1 else ''}"
        if self.ends_by == "train.max_steps":
            return f"ends at step {n(m)} (train.max_steps), in epoch {self.end_epoch}" + (f" of {e}" if e else "")
        if m and m > self.total_steps:
            return (f"train.max_steps={m} is more than {per} = {n(self.total_steps)}: "
                    f"train.epochs ends the run at step {n(self.total_steps)}")
        return f"ends at step {n(self.total_steps)}: {per} (train.epochs" + (
            "; train.max_steps is the same)" if m else ")")


def length(cfg, shards: int | None = None, steps: int | None = None) -> Length:
    """The run's length for `cfg`; `steps`: the steps per epoch when already known (a rank that
    built its data), else computed from the data set's size (steps_per_epoch)."""
    return Length(cfg, steps if steps is not None else steps_per_epoch(cfg, shards))


# ----------------------------------------------------------------------------- loading


def load_config(preset: str, overrides: list[str] | None = None, hw=None):
    """Preset name or path + `--set` overrides -> (a validated RunConfig, the preset's path).
    Raises ConfigError; a problem that comes from a `--set` value is said to come from `--set`."""
    import yaml

    from . import presets

    path = presets.resolve(preset)
    source = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise cfgmod.ConfigError([("", f"cannot read the preset: {getattr(exc, 'strerror', None) or exc}")],
                                 source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise cfgmod.ConfigError([("", cfgmod._yaml_error(exc))], source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise cfgmod.ConfigError([("", f"a preset must be a mapping of settings, got {type(data).__name__}")],
                                 source)
    keys, written = [], _flat(data)
    if overrides:
        try:
            cfgmod.apply_overrides(data, overrides)
        except cfgmod.ConfigError as exc:
            raise cfgmod.ConfigError(exc.problems, "--set") from None
        keys = [o.split("=", 1)[0].strip() for o in overrides]
    if hw is None:
        from .hardware import detect_hardware

        hw = detect_hardware()
    try:
        return from_dict(data, source=source, hw=hw), path
    except cfgmod.ConfigError as exc:
        def within(field: str, names) -> bool:
            return set_by(field, [f"{k}=" for k in names])
        blame = {f: "--set" for f, _ in exc.problems if within(f, keys)}
        # a combination names each of its values with where it came from: --set, the preset, the default
        involved = {f for p in exc.problems for f in getattr(p, "values", ())}
        came = {f: "--set" if within(f, keys) else source if within(f, written) else "the default" for f in involved}
        raise cfgmod.ConfigError(exc.problems, source, blame, came) from None


# ----------------------------------------------------------------------------- checks


def callable_problem(value: str) -> str | None:
    """Why `module:callable` would fail to load, found without running the user's code: the
    module is missing, does not parse, imports a package that is not installed, or defines no
    such name. (A rank would find the same a minute later, after the run has started.)"""
    import importlib.util

    from .usercode import extend_path

    module, _, attr = value.partition(":")
    looked = ", ".join(extend_path())  # where a rank looks too (engine.usercode): sys.path, then these
    try:
        spec = importlib.util.find_spec(module)  # imports only the parent packages
    except Exception as exc:  # ModuleNotFoundError of a parent, or an error importing it
        return f"cannot import {module!r}: {type(exc).__name__}: {exc} (looked on PYTHONPATH and in {looked})"
    if spec is None:
        return f"no module named {module!r} (looked on PYTHONPATH and in {looked})"
    origin = spec.origin or ""
    if not origin.endswith(".py"):
        return None  # compiled or namespace package: nothing to read
    return _source_problem(origin, module, attr, importlib.util.find_spec)


def _source_problem(origin: str, module: str, attr: str, find_spec) -> str | None:
    import ast
    import difflib

    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except SyntaxError as exc:
        return f"{origin}, line {exc.lineno}: syntax error: {exc.msg}"
    except (OSError, ValueError) as exc:
        return f"cannot read {origin}: {exc}"
    names, dynamic = set(), False

    def bind(target) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def visit(body, conditional: bool):
        nonlocal dynamic
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                dynamic |= node.name == "__getattr__"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in getattr(node, "targets", None) or [node.target]:
                    bind(t)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name == "*":
                        dynamic = True
                    names.add(a.asname or a.name.split(".")[0])
                why = _missing_import(node, conditional, origin, find_spec)
                if why:
                    return why
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for part in ("body", "orelse", "finalbody"):
                    why = visit(getattr(node, part, []) or [], True)
                    if why:
                        return why
                for h in getattr(node, "handlers", []):
                    visit(h.body, True)
                if isinstance(node, (ast.With, ast.For)):
                    bind(node.target if isinstance(node, ast.For) else ast.Tuple(
                        [i.optional_vars for i in node.items if i.optional_vars], ast.Load()))
            elif isinstance(node, ast.Expr) and "globals()" in ast.unparse(node):
                dynamic = True
        return None

    why = visit(tree.body, False)
    if why:
        return why
    if attr not in names and not dynamic:
        funcs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        guess = difflib.get_close_matches(attr, funcs, n=1)
        hint = f"; did you mean '{module}:{guess[0]}'?" if guess else (
            f"; it defines {', '.join(funcs[:6])}" if funcs else "")
        return f"{module} ({origin}) defines no {attr!r}{hint}"
    return None


def _missing_import(node, conditional: bool, origin: str, find_spec) -> str | None:
    """An unconditional top-level import of a package that is not installed."""
    import ast

    top = (node.names[0].name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
    if conditional or not top or getattr(node, "level", 0) != 0:
        return None
    try:
        missing = find_spec(top) is None
    except (ImportError, ValueError):
        missing = False
    if missing:
        return (f"{origin}, line {node.lineno}: imports {top!r}, which cannot be found "
                "(pip install it, or add its folder to PYTHONPATH)")
    return None


def looks_like_checkpoint(path: Path) -> bool:
    """torch.save's zip archive with its pickle inside: checked without torch (or a long load)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def file_problems(cfg) -> list[Problem]:
    """What the schema cannot see: folders and files the config names, and user code."""
    if kind_of(cfg).is_script:
        return script_problems(cfg)
    strategy = strategies.get_strategy(cfg.strategy)
    problems: list[Problem] = strategy.preflight(cfg)  # deepspeed: its ds_config.json, its resume folder
    if cfg.data.dataset == "imagefolder":
        root = Path(cfg.data.root).expanduser()
        if not root.is_dir():
            problems.append(("data.root", f"no such folder {str(root)!r} (imagefolder needs a folder with one "
                                          "sub-folder per class)"))
    if cfg.data.dataset in ("cifar10", "mnist", "fashionmnist") and not cfg.data.download:
        root = Path(cfg.data.root).expanduser()
        if not root.is_dir():
            problems.append(("data.root", f"no such folder {str(root)!r}, and data.download is false; set "
                                          f"data.download: true to fetch {cfg.data.dataset} (needs network) "
                                          "or put its files there"))
    resume = "" if strategy.checkpoint_dirs else cfg.checkpoint.resume  # a folder: the strategy checked it
    if resume and resume != "latest" and not Path(resume).expanduser().is_file():
        problems.append(("checkpoint.resume", f"no such checkpoint file {resume!r} (use a ckpt-*.pt path from a "
                                              "run's checkpoints/ folder, or 'latest')"))
    elif resume and resume != "latest" and not looks_like_checkpoint(Path(resume).expanduser()):
        problems.append(("checkpoint.resume", f"{resume!r} is not a PyTorch checkpoint (torch.save writes a zip "
                                              "archive; this is not one, or it is cut short)"))
    for fld, value, builtin in (("model.name", cfg.model.name, cfgmod.BUILTIN_MODELS),
                                ("data.dataset", cfg.data.dataset, cfgmod.BUILTIN_DATASETS),
                                ("train.loss", cfg.train.loss, cfgmod.LOSSES)):
        if value not in builtin and ":" in value:
            why = callable_problem(value)
            if why:
                problems.append((fld, why))
    return problems


# ----------------------------------------------------------------------------- a script run


def script_cwd(cfg) -> Path:
    """The folder a script run's ranks start in: script.cwd, else the working directory."""
    return Path(cfg.script.cwd or os.getcwd()).expanduser()


def script_problems(cfg) -> list[Problem]:
    """What stops the user's script from starting, found without running it: a folder, script or
    executable that is not there, a module that cannot be found, a syntax error (with its line)."""
    s, cwd = cfg.script, script_cwd(cfg)
    if not cwd.is_dir():
        return [("script.cwd", f"no such folder {str(cwd)!r} to run the script in")]
    if s.module:
        return _module_problems(s.module, cwd, s.env.get("PYTHONPATH", ""))
    if not s.path:
        return []  # the strategy's check says a script run needs one
    target = Path(s.path).expanduser()
    where = target if target.is_absolute() else cwd / target
    if s.no_python:
        if "/" not in s.path and not where.exists():
            if shutil.which(s.path) is None:
                return [("script.path", f"--no-python: no executable {s.path!r} in {cwd} or on PATH")]
            return []
        if not where.is_file():
            return [("script.path", f"--no-python: no such executable {s.path!r} (looked in {cwd})")]
        if not os.access(where, os.X_OK):
            return [("script.path", f"--no-python: {s.path} is not executable (chmod +x it, or leave out "
                                    "--no-python to run it with python)")]
        return []
    if where.is_dir():
        if (where / "__main__.py").is_file():
            return _syntax_problem(where / "__main__.py", s.path.rstrip("/") + "/__main__.py")
        return [("script.path", f"{s.path} is a folder without __main__.py, not a script (looked in {cwd})")]
    if not where.is_file():
        return [("script.path", f"no such script {s.path!r} (looked in {where.parent})")]
    return _syntax_problem(where, s.path)


def _syntax_problem(path: Path, shown: str) -> list[Problem]:
    """compile() the file as python would (nothing runs): `train.py:12: SyntaxError: ...`."""
    try:
        source = path.read_bytes()
    except OSError as exc:
        return [("script.path", f"cannot read {shown}: {exc.strerror or exc}")]
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = f":{exc.lineno}" if exc.lineno else ""
        return [("script.path", f"{shown}{line}: {type(exc).__name__}: {exc.msg}")]
    except ValueError as exc:  # null bytes: not a python script
        return [("script.path", f"{shown}: not a python script ({exc})")]
    return []


def _module_problems(module: str, cwd: Path, pythonpath: str = "") -> list[Problem]:
    """`python -m MODULE` from cwd, found as python would find it but without importing anything
    (not even its parent packages): each part looked up on the path in turn."""
    import importlib.machinery
    import sys

    extra = [p for p in pythonpath.split(os.pathsep) if p]
    search = [str(cwd), *extra, *[p for p in sys.path if p]]
    looked = f"looked in {cwd} and on the python path"
    parts, spec, path = module.split("."), None, search
    if not all(p.isidentifier() for p in parts):
        return [("script.module", f"{module!r} is not a module name (python -m takes dotted names, like pkg.train)")]
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if i == 0 and name in sys.builtin_module_names:
            return []
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return [("script.module", f"no module named {name!r} ({looked})")]
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                return [("script.module", f"{name} ({spec.origin}) is a module, not a package: it has no {parts[i + 1]!r}")]
            path = list(spec.submodule_search_locations)
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        main = importlib.machinery.PathFinder.find_spec(module + ".__main__", list(spec.submodule_search_locations))
        if main is None:
            return [("script.module", f"{module} is a package without __main__.py: python -m cannot run it")]
        spec = main
    origin = spec.origin or ""
    if origin.endswith(".py"):
        return [("script.module", why) for _, why in _syntax_problem(Path(origin), origin)]
    return []


def host_problems(cfg) -> list[Problem]:
    """What stops a valid config from starting on this host. Such a config may be meant for other
    nodes, so it still saves and exports; only a launch here is refused."""
    problems: list[Problem] = []
    ifname = cfg.nodes.ifname
    # NCCL-style patterns (^docker, =eth0) are NCCL's to read; plain names must exist here
    if ifname and strategies.get_strategy(cfg.strategy).distributed and not any(c in ifname for c in "^="):
        have = [name for _, name in socket.if_nameindex()]
        missing = [n for n in ifname.split(",") if n and n not in have]
        if missing:
            problems.append(("nodes.ifname", f"this host has no network interface {', '.join(missing)} (it has: "
                                             f"{', '.join(have)}); pick the one that reaches the other nodes, or "
                                             "leave it empty"))
    return problems


def check(cfg) -> list[Problem]:
    """Everything that must hold before this host starts `cfg`; empty when it may start."""
    return file_problems(cfg) + host_problems(cfg)


def set_by(field: str, overrides) -> bool:
    """Whether `--set` values (key=value) gave this field, or a section or a key inside it."""
    keys = [str(o).split("=", 1)[0].strip() for o in overrides or ()]
    return bool(field) and any(field == k or field.startswith(k + ".") or k.startswith(field + ".") for k in keys)


def lines(problems: list[Problem], source: str | None = None, overrides=None) -> list[str]:
    """The problems as the CLI prints them (the app shows the same words on the field), each
    blamed on where its value came from: `--set` (overrides) where it gave the field, else source."""
    def where(f: str) -> str:
        src = "--set" if set_by(f, overrides) else source
        return f"{src}: " if src else ""

    return [f"{where(f)}{f}: {why}" if f else f"{where(f)}{why}" for f, why in problems]


# What torchdeck sets in each rank's environment for a script run (engine.launch.env builds them).
SCRIPT_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
              "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS")
SCRIPT_ENV_OURS = ("TORCHDECK_EVENTS_FD", "TORCHDECK_STACKS_FILE", "TORCHDECK_RUN_DIR", "TORCHELASTIC_ERROR_FILE")


def script_command(cfg) -> list[str]:
    """The command line each rank of a script run runs (the shim around the script, or with
    no_python the executable itself)."""
    s = cfg.script
    if s.no_python:
        return [s.path, *s.args]
    from .launch import shim_argv

    return shim_argv(s.module or s.path, list(s.args), module=bool(s.module))


def describe_script(cfg) -> list[str]:
    """What a script run will do: `torchdeck validate` prints it (the loop's fields do not apply)."""
    from .affinity import threads_for
    from . import fmt

    s, strat = cfg.script, strategies.get_strategy(cfg.strategy)
    n, world = strategies.nproc_per_node(cfg), strategies.world_size(cfg)
    what = f"python -m {s.module}" if s.module else (s.path if s.no_python else f"python {s.path}")
    lines = [f"strategy {strat.name}: your own script ({what}), started as torchrun starts it, on {cfg.accelerator}",
             f"each rank runs, in {script_cwd(cfg)}: {shlex.join(script_command(cfg))}"
             + (" (--local-rank=N added: " + s.local_rank_arg + ")" if s.local_rank_arg else ""),
             f"processes: {n} per node x {cfg.nodes.num_nodes} node(s) = world size {world}"]
    per_rank = [(cfg.nodes.node_rank * n + lr, ",".join(strat.local_devices(cfg, lr))) for lr in range(n)]
    lines.append("devices per rank: " + fmt.rank_groups(per_rank))
    from .launch.env import threads_of

    planned = threads_for(cfg, n)
    threads = threads_of(s.env, os.environ, planned)  # what the ranks get: the user's value wins
    lines.append(f"threads per rank: {threads} (OMP_NUM_THREADS" + (", yours)" if threads != planned else ")"))
    names = list(SCRIPT_ENV) + (["CUDA_VISIBLE_DEVICES"] if cfg.accelerator == "cuda" else [])
    lines.append("environment torchdeck sets: " + ", ".join(names))
    if not s.no_python:
        lines.append("and for its own use: " + ", ".join(SCRIPT_ENV_OURS)
                     + (", TORCHDECK_LOCAL_RANK_ARG" if s.local_rank_arg else ""))
    if s.env:
        lines.append("your environment (script.env): " + ", ".join(sorted(s.env)))
    lines.append(f"stop: SIGTERM to the ranks, SIGKILL to their process trees after {s.stop_grace_s:g} s")
    if s.no_python:
        lines.append("no_python: no step counts, error capture or stacks on demand (no python shim around it)")
    return lines


def describe(cfg) -> list[str]:
    """What the config will do, in a few lines: `torchdeck validate` prints them."""
    if kind_of(cfg).is_script:
        return describe_script(cfg)
    from . import fmt

    strat = strategies.get_strategy(cfg.strategy)
    n, world = strategies.nproc_per_node(cfg), strategies.world_size(cfg)
    lines = [
        f"strategy {cfg.strategy} ({strat.summary}) on {cfg.accelerator}, backend "
        f"{cfg.resolved_backend if strat.distributed else 'none'}, precision {cfg.train.precision}",
        f"processes: {n} per node x {cfg.nodes.num_nodes} node(s) = world size {world}",
        f"global batch: {fmt.num(cfg.train.batch_size, ',')} per process x {world} x accumulation "
        f"{cfg.train.grad_accum} = {fmt.num(strategies.global_batch(cfg), ',')}",
    ]
    per_rank = [(cfg.nodes.node_rank * n + lr, ",".join(strat.local_devices(cfg, lr))) for lr in range(n)]
    lines.append("devices per rank: " + fmt.rank_groups(per_rank))  # identical ranks said once (fmt)
    lines.append(f"model {cfg.model.name}, data {cfg.data.dataset}, optimizer {cfg.optimizer.name} "
                 f"lr {cfg.optimizer.lr:g}, epochs {cfg.train.epochs}"
                 + (f", max steps {cfg.train.max_steps}" if cfg.train.max_steps else ""))
    lines.append("length: " + length(cfg).said())  # which of train.epochs / train.max_steps ends it
    from .losses import describe as loss_said

    lines.append(loss_said(cfg))  # train.loss, where the config tells it; else decided on the first batch
    from .cache import plan

    lines.append(plan(cfg, n).line)  # decoded once within the node's budget, or streamed
    from .affinity import describe as cores

    lines.append(cores(cfg, n))  # train.cpu_affinity on this host
    return lines + [line for _, line in strat.resolve(cfg.copy())]  # deepspeed: its ds_config, what it replaces


# ----------------------------------------------------------------------------- where values came from

# Environment variables torchdeck itself reads, and what each changes (shown when set).
ENV_READ = {
    "TORCHDECK_PRESETS": "where user presets are looked up and saved",
    "XDG_CONFIG_HOME": "user presets live under it (unless TORCHDECK_PRESETS is set)",
    "TORCHDECK_RUNS": "where run directories go (unless --runs-dir)",
    "CUDA_VISIBLE_DEVICES": "which physical GPUs the indices in `devices` name",
    "GLOO_SOCKET_IFNAME": "the ranks' network interface for gloo; wins over nodes.ifname",
    "NCCL_SOCKET_IFNAME": "the ranks' network interface for NCCL; wins over nodes.ifname",
}


def _flat(data, prefix: str = "") -> dict:
    """{"train.batch_size": 64, ...}: mappings flattened, lists kept whole (they are one value)."""
    out = {}
    for k, v in (data or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _preset_kind(path: Path) -> str:
    from . import presets

    path = path.resolve()
    for kind, folder in (("shipped preset", presets.shipped_presets_dir()), ("user preset", presets.user_presets_dir())):
        try:
            path.relative_to(folder.resolve())
            return kind
        except (ValueError, OSError):
            pass
    return "preset file"


def explain(preset: str, overrides: list[str] | None, cfg, path: Path) -> list[str]:
    """Every value that is not the schema's default, with where it came from (the preset file,
    shipped or the user's, a --set, this host), then the environment variables that change what
    a run does: no hidden global config (Accelerate issue 1133)."""
    import yaml

    from . import presets

    try:
        written = _flat(yaml.safe_load(Path(path).read_text()) or {})
    except (OSError, ValueError, yaml.YAMLError):
        written = {}
    sets: dict[str, str] = {}
    for item in overrides or []:
        key, _, raw = item.partition("=")
        sets[key.strip()] = item
    now, default = _flat(cfg.to_dict()), _flat(cfgmod.RunConfig().to_dict())
    kind = _preset_kind(Path(path))
    rows = []
    for key, value in now.items():
        if key == "schema_version" or (key in default and value == default[key]):
            continue
        set_by = next((item for k, item in sets.items() if key == k or key.startswith(k + ".")), None)
        if set_by is not None:
            where, said = f"--set {set_by}", set_by.partition("=")[2]
        elif key in written or any(key.startswith(k + ".") for k in written):
            where, said = f"{kind} {path}", written.get(key)
        else:  # filled in by validation from this host (devices: -1, threads...)
            where, said = "this host (resolved when validated)", None
        shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        if said is not None and str(said) != str(value) and said != value:
            shown += f"  (written as {said})"
        rows.append((f"{key} = {shown}", where))
    width = min(max((len(a) for a, _ in rows), default=0), 40)
    out = ["values that are not defaults, and where each came from:"]
    out += [f"  {a.ljust(width)}  {b}" for a, b in rows] or ["  (none: every value is the default)"]
    name = str(preset)
    if kind == "shipped preset" and Path(name).name == name and not name.startswith("shipped:"):
        user = presets._find(name, "user")
        if user:
            out.append(f"  note: a user preset {user} has the same name; the shipped one was used (say user:{name})")
    env = [(k, os.environ[k], why) for k, why in ENV_READ.items() if os.environ.get(k)]
    out.append("environment read by torchdeck:" if env else "environment read by torchdeck: none of "
               + ", ".join(ENV_READ) + " is set")
    out += [f"  {k}={v}: {why}" for k, v, why in env]
    return out
