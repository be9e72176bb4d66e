"""`torchdeck`: the app with no arguments, and headless commands for everything else.

Starts fast (`--help` must not wait for torch): heavy modules are imported inside the command
that needs them. User mistakes (a broken preset, a missing data root) are one line each on
stderr with exit status 2 and nothing started; `--debug` adds the traceback.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A problem the user can fix; printed as one line per problem, exit 2."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- config loading


def load_config(preset: str, overrides: list[str] | None = None, hw=None):
    """Preset name or path + `--set` overrides -> a validated RunConfig (ConfigError otherwise)."""
    import yaml

    from engine import config as cfgmod
    from engine import presets

    path = presets.resolve(preset)
    source = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise cfgmod.ConfigError([("", f"cannot read the preset: {getattr(exc, 'strerror', None) or exc}")], source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise cfgmod.ConfigError([("", cfgmod._yaml_error(exc))], source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise cfgmod.ConfigError([("", f"a preset must be a mapping of settings, got {type(data).__name__}")], source)
    if overrides:
        try:
            cfgmod.apply_overrides(data, overrides)
        except cfgmod.ConfigError as exc:
            raise cfgmod.ConfigError(exc.problems, "--set") from None
    if hw is None:
        from engine.hardware import detect_hardware

        hw = detect_hardware()
    return cfgmod.from_dict(data, source=source, hw=hw)


def _callable_problem(value: str) -> str | None:
    """Why `module:callable` would fail to load, found without running the user's code: the
    module is missing, does not parse, imports a package that is not installed, or defines no
    such name. (A rank would find the same a minute later, after the run has started.)"""
    import importlib.util

    module, _, attr = value.partition(":")
    added = os.getcwd() not in sys.path  # the supervisor runs with cwd on sys.path; so check with it
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        try:
            spec = importlib.util.find_spec(module)  # imports only the parent packages
        except Exception as exc:  # ModuleNotFoundError of a parent, or an error importing it
            return (f"cannot import {module!r}: {type(exc).__name__}: {exc} (looked in the current "
                    "directory and on PYTHONPATH)")
        if spec is None:
            return f"no module named {module!r} (looked in the current directory and sys.path)"
        origin = spec.origin or ""
        if not origin.endswith(".py"):
            return None  # compiled or namespace package: nothing to read
        return _source_problem(origin, module, attr, importlib.util.find_spec)
    finally:
        if added:
            sys.path.remove(os.getcwd())


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
                top = (node.names[0].name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
                if not conditional and top and getattr(node, "level", 0) == 0:
                    try:
                        missing = find_spec(top) is None
                    except (ImportError, ValueError):
                        missing = False
                    if missing:
                        return (f"{origin}, line {node.lineno}: imports {top!r}, which cannot be found "
                                "(pip install it, or add its folder to PYTHONPATH)")
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


def _looks_like_checkpoint(path: Path) -> bool:
    """torch.save's zip archive with its pickle inside: checked without torch (or a long load)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def preflight(cfg, source: str) -> list[str]:
    """Checks the schema cannot make (they look at the file system), cheap enough to run first."""
    from engine.config import BUILTIN_DATASETS, BUILTIN_MODELS

    problems = []
    if cfg.data.dataset == "imagefolder":
        root = Path(cfg.data.root).expanduser()
        if not root.is_dir():
            problems.append(f"{source}: data.root: no such folder {str(root)!r} (imagefolder needs a "
                            f"folder with one sub-folder per class)")
    if cfg.data.dataset in ("cifar10", "mnist", "fashionmnist") and not cfg.data.download:
        root = Path(cfg.data.root).expanduser()
        if not root.is_dir():
            problems.append(f"{source}: data.root: no such folder {str(root)!r}, and data.download is false; "
                            f"set data.download: true to fetch {cfg.data.dataset} (needs network) or put "
                            f"its files there")
    resume = cfg.checkpoint.resume
    if resume and resume != "latest" and not Path(resume).expanduser().is_file():
        problems.append(f"{source}: checkpoint.resume: no such checkpoint file {resume!r} "
                        f"(use a ckpt-*.pt path from a run's checkpoints/ folder, or 'latest')")
    elif resume and resume != "latest" and not _looks_like_checkpoint(Path(resume).expanduser()):
        problems.append(f"{source}: checkpoint.resume: {resume!r} is not a PyTorch checkpoint (torch.save "
                        f"writes a zip archive; this is not one, or it is cut short)")
    for fld, value, builtin in (("model.name", cfg.model.name, BUILTIN_MODELS),
                                ("data.dataset", cfg.data.dataset, BUILTIN_DATASETS)):
        if value not in builtin and ":" in value:
            why = _callable_problem(value)
            if why:
                problems.append(f"{source}: {fld}: {why}")
    return problems


def _config_or_usage(args, hw=None):
    from engine.config import ConfigError

    overrides = list(args.set or [])
    if getattr(args, "node_rank", None) is not None:
        overrides.append(f"nodes.node_rank={args.node_rank}")
    try:
        cfg = load_config(args.preset, overrides, hw=hw)
    except ConfigError as exc:
        raise UsageError(str(exc).splitlines()) from None
    from engine.presets import resolve

    problems = preflight(cfg, str(resolve(args.preset)))
    if problems:
        raise UsageError(problems)
    return cfg


# ----------------------------------------------------------------------------- following a run


class _Interrupts:
    """Counts Ctrl-C instead of raising mid-write; restores the old handler on exit."""

    def __init__(self):
        self.count = 0
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._hit)
        except ValueError:  # not the main thread: keep the default behaviour
            self._old = None
        return self

    def _hit(self, signum, frame):
        self.count += 1

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def follow(run, display, on_interrupt=None, interval: float = 0.2) -> dict:
    """Feed the display from events.jsonl until the run ends; returns the final status dict.

    on_interrupt(n) is called for the n-th Ctrl-C; returning False stops following.
    """
    from engine import launch
    from engine.events import Tail

    tail = Tail(run.events_path)
    seen = 0
    with _Interrupts() as ints:
        while True:
            evs = tail.poll()
            display.feed(evs)
            if any(ev.get("kind") == "run_finished" for ev in evs):
                break
            while ints.count > seen:
                seen += 1
                if on_interrupt is not None and on_interrupt(seen) is False:
                    return {"status": "detached"}
            if not evs:
                status = run.status()
                if status not in ("running", "starting"):
                    display.feed(tail.poll())  # the supervisor's last lines
                    break
                time.sleep(interval)
    final = run.final_status() or launch.wait(run, timeout=2) or {
        "status": "failed", "root_cause": f"the supervisor is gone; see {run.path / 'supervisor.log'}"}
    if display.view.status not in ("finished", "failed", "stopped"):
        display.view.status = final.get("status", "failed")
        display.view.root_cause = display.view.root_cause or final.get("root_cause")
    display.finish()
    if final.get("status") == "failed" and not display.view.errors:
        _print_log_tail(run.path / "supervisor.log")
    return final


def _print_log_tail(path: Path, n: int = 10) -> None:
    try:
        lines = path.read_text(errors="replace").rstrip().splitlines()[-n:]
    except OSError:
        return
    if lines:
        print(f"last lines of {path}:")
        for ln in lines:
            print("    " + ln)


def _exit_for(final: dict) -> int:
    return EXIT_OK if final.get("status") in ("finished", "stopped") else EXIT_FAILED


# ----------------------------------------------------------------------------- commands


def cmd_run(args) -> int:
    from engine import launch
    from engine.progress import Display

    cfg = _config_or_usage(args)
    if cfg.accelerator == "cuda":
        from engine.hardware import visible_devices_warning

        warn = visible_devices_warning()
        if warn:
            _err("warning: " + warn)
    try:
        run = launch.start(cfg, root=args.runs_dir)
    except OSError as exc:
        where = args.runs_dir or os.environ.get("TORCHDECK_RUNS") or "./runs"
        raise UsageError([f"cannot create the run directory under {where}: {exc.strerror or exc}"]) from None
    print(f"run directory: {run.path}", flush=True)
    if args.detach:
        print(f"running in the background; watch it with: torchdeck attach {run.path}\n"
              f"stop it with: torchdeck stop {run.path}")
        return EXIT_OK

    def on_interrupt(n: int):
        if n == 1:
            launch.request_stop(run)
            print("stopping: finishing the step and checkpointing; Ctrl-C again to kill", flush=True)
        else:
            pids = launch.kill(run)
            print(f"killed {len(pids)} process(es) of the run", flush=True)
        return True

    final = follow(run, Display(), on_interrupt)
    return _exit_for(final)


def _find_run(ref: str, runs_dir: str | None):
    from engine.rundir import RunDir, list_runs, runs_root

    root = Path(runs_dir).resolve() if runs_dir else runs_root()
    if ref == "latest":
        runs = list_runs(root)
        if not runs:
            raise UsageError([f"no runs under {root}"])
        return runs[0]
    p = Path(ref).expanduser()
    for cand in (p, root / ref):
        if (cand / "config.yaml").is_file():
            return RunDir(cand.resolve())
    raise UsageError([f"no run {ref!r}: give a run directory, a name under {root}, or 'latest' "
                      f"(`torchdeck runs` lists them)"])


def cmd_attach(args) -> int:
    from engine.progress import Display

    run = _find_run(args.run, args.runs_dir)
    print(f"attached to {run.path} (Ctrl-C detaches; the run goes on)", flush=True)

    def on_interrupt(n: int):
        print(f"detached; the run goes on. Re-attach with: torchdeck attach {run.path}", flush=True)
        return False

    final = follow(run, Display(), on_interrupt)
    if final.get("status") == "detached":
        return EXIT_OK
    return _exit_for(final)


def cmd_runs(args) -> int:
    from engine.rundir import list_runs, runs_root

    root = Path(args.runs_dir).resolve() if args.runs_dir else runs_root()
    runs = list_runs(root)
    if not runs:
        print(f"no runs under {root}")
        return EXIT_OK
    rows = [("RUN", "STATUS", "STRATEGY", "WORLD", "RESULT")]
    for r in runs:
        try:
            cfg = r.config()
            strategy, world = cfg.strategy, str(cfg.world_size)
        except Exception:
            strategy, world = "?", "?"
        final = r.final_status() or {}
        rows.append((r.name, r.status(), strategy, world, str(final.get("root_cause") or "")[:60]))
    _table(rows)
    print(f"({root})")
    return EXIT_OK


def cmd_stop(args) -> int:
    from engine import launch

    run = _find_run(args.run, args.runs_dir)
    status = run.status()
    if status not in ("running", "starting"):
        print(f"run {run.name} is not running (status: {status})")
        return EXIT_FAILED
    if args.kill:
        pids = launch.kill(run)
        print(f"killed {len(pids)} process(es) of run {run.name}")
        return EXIT_OK
    launch.request_stop(run)
    print(f"stop requested for {run.name}: ranks finish the current step, rank 0 checkpoints, "
          f"then all exit (`torchdeck stop --kill {run.name}` if it does not)")
    if args.wait:
        final = launch.wait(run, timeout=args.wait)
        if final is None:
            print(f"still running after {args.wait:g} s")
            return EXIT_FAILED
        print(f"run {final.get('status')}")
        return _exit_for(final)
    return EXIT_OK


def _table(rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def cmd_presets(args) -> int:
    from engine.presets import DEFAULT_PRESET, list_presets
    from engine.rundir import user_presets_dir

    infos = list_presets()
    shipped = {i.name for i in infos if i.source == "shipped"}
    rows = [("NAME", "SOURCE", "STRATEGY", "DESCRIPTION")]
    for i in infos:
        name = i.name + (" (default)" if i.name == DEFAULT_PRESET and i.source == "shipped" else "")
        if i.source == "user" and i.name in shipped:
            name += f" (use user:{i.name})"
        rows.append((name, i.source, i.strategy, i.description))
    _table(rows)
    print(f"user presets: {user_presets_dir()}")
    return EXIT_OK


def summary_lines(cfg) -> list[str]:
    from engine.strategies import get_strategy

    strat = get_strategy(cfg.strategy)
    n = cfg.nproc_per_node
    lines = [
        f"strategy {cfg.strategy} ({strat.summary}) on {cfg.accelerator}, backend "
        f"{cfg.resolved_backend if strat.distributed else 'none'}, precision {cfg.train.precision}",
        f"processes: {n} per node x {cfg.nodes.num_nodes} node(s) = world size {cfg.world_size}",
        f"global batch: {cfg.train.batch_size} per process x {cfg.world_size} x accumulation "
        f"{cfg.train.grad_accum} = {cfg.global_batch}",
    ]
    per_rank = []
    for lr in range(n):
        rank = cfg.nodes.node_rank * n + lr
        per_rank.append(f"rank {rank}: {','.join(strat.local_devices(cfg, lr))}")
    lines.append("devices per rank: " + "; ".join(per_rank))
    lines.append(f"model {cfg.model.name}, data {cfg.data.dataset}, optimizer {cfg.optimizer.name} "
                 f"lr {cfg.optimizer.lr:g}, epochs {cfg.train.epochs}"
                 + (f", max steps {cfg.train.max_steps}" if cfg.train.max_steps else ""))
    return lines


def cmd_validate(args) -> int:
    cfg = _config_or_usage(args)
    print(f"{args.preset}: valid")
    for line in summary_lines(cfg):
        print("  " + line)
    from engine.hardware import visible_devices_warning

    warn = visible_devices_warning() if cfg.accelerator == "cuda" else None
    if warn:
        print("  warning: " + warn)
    from engine.config import advice  # valid, but probably not meant (issue 14)
    print("".join(f"  warning: {field}: {why}\n" for field, why in advice(cfg)), end="")
    return EXIT_OK


def cmd_eval(args) -> int:
    ckpt = Path(args.checkpoint).expanduser()
    if not ckpt.is_file():
        raise UsageError([f"{args.checkpoint}: no such checkpoint file"])
    if args.data_root and not Path(args.data_root).expanduser().exists():
        raise UsageError([f"--data-root: no such folder {args.data_root!r}"])
    from engine.evaluate import evaluate

    try:
        res = evaluate(str(ckpt), data_root=args.data_root)
    except Exception as exc:
        # EvalError, DataError, ModelError: messages written for users; anything else is a bug
        if type(exc).__name__ in ("EvalError", "DataError", "ModelError") and not getattr(args, "debug", False):
            raise UsageError([str(exc)]) from None
        raise
    where = f" (epoch {res['epoch']}, step {res['step']})" if "step" in res else ""
    print(f"checkpoint {ckpt}{where}")
    print(f"  dataset {res.get('dataset')}: {res.get('samples')} samples, loss {res.get('loss'):.4f}, "
          f"accuracy {100 * res.get('accuracy', 0):.2f}%")
    return EXIT_OK


def env_report() -> list[str]:
    """A paste-able description of this host, for bug reports."""
    import importlib.metadata as md
    import platform

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    lines = [
        f"- torchdeck: {version('torchdeck')}",
        f"- python: {platform.python_version()} ({sys.executable})",
        f"- platform: {platform.platform()}",
        f"- textual: {version('textual')}",
    ]
    try:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        lines += [
            f"- torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
            f"- CUDA available: {cuda}" + (f", {torch.cuda.device_count()} device(s) visible to torch" if cuda else ""),
            f"- distributed: {dist.is_available()}; gloo {dist.is_gloo_available()}, "
            f"nccl {dist.is_nccl_available()}, mpi {dist.is_mpi_available()}",
        ]
        if cuda and dist.is_nccl_available():
            try:
                lines.append(f"- NCCL version: {'.'.join(map(str, torch.cuda.nccl.version()))}")
            except Exception:
                pass
    except Exception as exc:
        lines.append(f"- torch: cannot import ({type(exc).__name__}: {exc})")
    from engine.hardware import list_gpus, nvml_status, visible_devices_warning

    ok, why = nvml_status()
    if ok:
        gpus = list_gpus()
        lines.append(f"- GPUs (NVML): {len(gpus)}")
        for g in gpus:
            lines.append(f"  - {g.index}: {g.name}, {g.memory_used_mb}/{g.memory_total_mb} MiB used"
                         + (f", busy ({len(g.processes)} process(es))" if g.busy else ""))
    else:
        lines.append(f"- GPUs (NVML): none ({why})")
    warn = visible_devices_warning()
    if warn:
        lines.append(f"- note: {warn}")
    import psutil

    lines.append(f"- CPUs: {os.cpu_count()} logical, {psutil.cpu_count(logical=False) or '?'} physical; "
                 f"RAM {psutil.virtual_memory().total / 2**30:.1f} GiB")
    for var in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                "MASTER_ADDR", "MASTER_PORT", "TORCHDECK_RUNS", "TORCHDECK_PRESETS"):
        if var in os.environ:
            lines.append(f"- {var}={os.environ[var]}")
    return lines


def cmd_env(args) -> int:
    print("\n".join(env_report()))
    return EXIT_OK


def cmd_export(args) -> int:
    from engine import config as cfgmod
    from engine import export
    from engine.presets import resolve

    # The job runs on other hosts (a cluster's login node often has no GPU at all): validate
    # everything but this host's GPUs and MPI build.
    cfg = _config_or_usage(args, hw=cfgmod.Hardware(gpu_count=None, mpi_available=None))
    if cfg.accelerator == "cuda" and cfg.devices == "all":
        raise UsageError(["devices: all: an exported job cannot know how many GPUs its nodes have; list "
                          "them, e.g. --set 'devices=[0,1,2,3]'"])
    if args.sbatch:
        print(export.sbatch(cfg), end="")
        return EXIT_OK
    if args.write_config:
        config_path = Path(args.write_config).expanduser().resolve()
        try:
            cfgmod.save(cfg, config_path)
        except OSError as exc:
            raise UsageError([f"--write-config: cannot write {config_path}: {exc.strerror or exc}"]) from None
    elif args.set or args.node_rank is not None:
        raise UsageError(["--torchrun with --set: add --write-config FILE so every node reads the same, "
                          "overridden config"])
    else:
        config_path = resolve(args.preset).resolve()
    print(export.torchrun(cfg, str(config_path), args.run_root), end="")
    return EXIT_OK


def cmd_app(args) -> int:
    from engine.presets import DEFAULT_PRESET, resolve

    preset = getattr(args, "preset", None) or DEFAULT_PRESET
    from engine.config import ConfigError

    try:
        path = resolve(preset)
    except ConfigError as exc:
        raise UsageError(str(exc).splitlines()) from None
    try:
        from app.main import run as run_app
    except ImportError as exc:
        raise UsageError([f"the terminal app cannot start: {exc}; headless commands: torchdeck --help"]) from None
    run_app(preset_path=str(path))
    return EXIT_OK


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand that was not given --debug must not reset `torchdeck --debug run ...`
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors")
    runs_dir = argparse.ArgumentParser(add_help=False)
    runs_dir.add_argument("--runs-dir", metavar="DIR", help="where runs live (default $TORCHDECK_RUNS or ./runs)")
    overrides = argparse.ArgumentParser(add_help=False)
    overrides.add_argument("--set", action="append", metavar="KEY=VALUE",
                           help="override a preset value, e.g. --set train.batch_size=128 (repeatable)")

    p = argparse.ArgumentParser(
        prog="torchdeck", parents=[common],
        description="Configure, launch and watch PyTorch training runs. No command: open the app.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("app", parents=[common], help="open the terminal app (the default)")
    s.add_argument("preset", nargs="?", help="preset name or YAML file to load")
    s.set_defaults(func=cmd_app)

    s = sub.add_parser("run", parents=[common, runs_dir, overrides], help="run a preset headless")
    s.add_argument("preset", help="preset name (`torchdeck presets`) or YAML file")
    s.add_argument("--detach", action="store_true", help="start it and return; watch later with attach")
    s.add_argument("--node-rank", type=int, help="this node's rank in a multi-node run (nodes.node_rank)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("attach", parents=[common, runs_dir], help="watch a run (history, then live)")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("runs", parents=[common, runs_dir], help="list runs with their status")
    s.set_defaults(func=cmd_runs)

    s = sub.add_parser("stop", parents=[common, runs_dir], help="stop a run gracefully (checkpoint first)")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.add_argument("--kill", action="store_true", help="SIGKILL every process of the run instead")
    s.add_argument("--wait", type=float, metavar="SECONDS", nargs="?", const=60.0,
                   help="wait for the run to end (default 60 s)")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("presets", parents=[common], help="list shipped and user presets")
    s.set_defaults(func=cmd_presets)

    s = sub.add_parser("validate", parents=[common, overrides],
                       help="check a preset and show world size, global batch, devices")
    s.add_argument("preset")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("eval", parents=[common], help="test accuracy of a checkpoint")
    s.add_argument("checkpoint")
    s.add_argument("--data-root", metavar="DIR", help="where the data set lives, if not where it was trained")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("env", parents=[common], help="paste-able report of versions, GPUs, backends")
    s.set_defaults(func=cmd_env)

    s = sub.add_parser("export", parents=[common, overrides], help="print a torchrun command or sbatch script")
    s.add_argument("preset")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--torchrun", action="store_true", help="torchrun command line per node")
    g.add_argument("--sbatch", action="store_true", help="SLURM sbatch script (srun + torchrun)")
    s.add_argument("--write-config", metavar="FILE", help="save the resolved config here and point torchrun at it")
    s.add_argument("--run-root", default="runs", metavar="DIR", help="where each node's run directory goes")
    s.add_argument("--node-rank", type=int, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    func = getattr(args, "func", cmd_app)
    try:
        return func(args)
    except UsageError as exc:
        for line in exc.lines:
            _err(line)
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        _err(f"torchdeck {args.command or 'app'}: {type(exc).__name__}: {exc} (--debug shows the traceback)")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
