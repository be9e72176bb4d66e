"""`torchdeck launch`'s command line: torchrun's own flags (both spellings) and torchdeck's, turned
into a script run's config dict (strategy script, engine.config). The CLI stays thin: it parses
with `parser()`, builds with `to_config`, and checks with engine.preflight like every run.

Replacing the word `torchrun` in a command line works:

    torchrun --nproc-per-node 2 train.py --epochs 3
    torchdeck launch --nproc-per-node 2 train.py --epochs 3

torchrun's flags that torchdeck does not support (elastic rendezvous) are refused by name
with what to do instead. Its output flags (--tee, --redirects, --local-ranks-filter, --log-dir) are
taken with their meanings mapped onto a run directory: `output_rule`. Stdlib only.
"""
from __future__ import annotations

import argparse
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

# torchrun's flags torchdeck does not take -> what to do instead (the first name is shown)
UNSUPPORTED = {
    ("--rdzv-backend", "--rdzv_backend"): "torchdeck meets at --master-addr/--master-port (a static rendezvous); "
                                          "leave it out",
    ("--rdzv-endpoint", "--rdzv_endpoint"): "give node 0's address as --master-addr HOST --master-port PORT",
    ("--rdzv-id", "--rdzv_id"): "leave it out (the run's name, --name, is TORCHELASTIC_RUN_ID)",
    ("--rdzv-conf", "--rdzv_conf"): "leave it out (a static rendezvous has no options)",
    ("--monitor-interval", "--monitor_interval"): "leave it out (torchdeck's supervisor watches the ranks)",
    ("--start-method", "--start_method"): "leave it out (each rank is its own process, started by exec)",
    ("--role",): "leave it out (every rank's role is 'default')",
    ("--run-path", "--run_path"): "give the script's path (torchdeck runs it with runpy's run_path)",
    ("--logs-specs", "--logs_specs"): "leave it out: the logs are in the run directory",
    ("--local-addr", "--local_addr"): "leave it out (a static rendezvous needs only --master-addr)",
    ("--event-log-handler", "--event_log_handler"): "leave it out (events go to the run's events.jsonl)",
    ("--numa-binding", "--numa_binding"): "leave it out (torchdeck places each rank on cores of its own where "
                                          "it can)",
    ("--signals-to-handle", "--signals_to_handle"): "leave it out (stop sends SIGTERM, then SIGKILL)",
    ("--no-auto-proxy-setup",): "leave it out",
}

# config field -> the flag that set it (problems are said in the words the user typed)
FLAG_OF = {
    "devices": "--nproc-per-node/--devices", "accelerator": "--nproc-per-node/--devices",
    "nodes.num_nodes": "--nnodes", "nodes.node_rank": "--node-rank", "nodes.master_addr": "--master-addr",
    "nodes.master_port": "--master-port", "script.local_rank_arg": "--local-rank-arg", "script.env": "--env",
    "name": "--name", "train.max_restarts": "--max-restarts",
}


class _Unsupported(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", "?")
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        names = next(k for k in UNSUPPORTED if option_string in k)
        raise UsageError(f"torchdeck launch: {option_string} is a torchrun flag torchdeck does not support: "
                         f"{UNSUPPORTED[names]}")


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message):
        if "arguments are required" in message:  # argparse counts ARGS (REMAINDER) in too
            raise UsageError("torchdeck launch: which script? torchdeck launch [options] train.py [args...] "
                             "(or -m MODULE)")
        raise UsageError(f"torchdeck launch: {message} (torchdeck launch --help lists the flags)")


def parser(parents=(), prog: str = "torchdeck launch") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog, parents=list(parents), allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] (SCRIPT | -m MODULE | --no-python EXECUTABLE) [ARGS...]",
        description="Run your own training script as torchrun runs it, and watch it: replace the word "
                    "`torchrun` in your command line with `torchdeck launch`.",
        epilog="torchrun flags torchdeck does not support (refused by name, with what to do instead):\n  "
               + ", ".join(k[0] for k in UNSUPPORTED)
               + "\n\npython -m torch.distributed.launch --nproc_per_node=2 train.py: "
                 "torchdeck launch --nproc-per-node 2 --local-rank-arg train.py (or --use-env if the script "
                 "reads LOCAL_RANK)\n")
    t = p.add_argument_group("torchrun's flags (both spellings)")
    t.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", metavar="N",
                   help="processes per node: N, gpu (one per visible GPU), cpu (one per usable core), "
                        "auto (gpu if there are GPUs, else cpu); default 1")
    t.add_argument("--nnodes", metavar="N", default="1", help="number of nodes: N (or N:N; no elastic range)")
    t.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0, metavar="R",
                   help="this node's rank, 0..nnodes-1")
    t.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1", metavar="HOST",
                   help="node 0's address (default 127.0.0.1)")
    t.add_argument("--master-port", "--master_port", dest="master_port", type=int, metavar="PORT",
                   help="node 0's port (default: a free port on one node, 29500 on several)")
    t.add_argument("--standalone", action="store_true", help="one node, a free port on this host")
    t.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0, metavar="N",
                   help="after a failure, start the script again up to N times (TORCHELASTIC_RESTART_COUNT "
                        "says which attempt); one node only")
    t.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run SCRIPT as an executable, not with python (no step counts, error capture or stacks)")
    t.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module: python -m SCRIPT")
    t.add_argument("--use-env", "--use_env", dest="use_env", action="store_true",
                   help="torch.distributed.launch's: the rank only in the environment (torchdeck's default)")
    t.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter", metavar="R,R",
                   help="only these local ranks' output on the terminal, e.g. 0 or 0,1 (every rank's is kept in "
                        "rank<N>.log all the same)")
    t.add_argument("-r", "--redirects", metavar="STD", default="0",
                   help="output only to the rank logs, not the terminal: 0 none, 1 stdout, 2 stderr, 3 both, or "
                        "per local rank 0:3,1:0. A rank's stdout and stderr share rank<N>.log in the order written, "
                        "so the terminal shows both or neither: neither once its stdout is redirected")
    t.add_argument("-t", "--tee", metavar="STD", default="0",
                   help="output to the rank logs and the terminal (same format): torchdeck always does both, "
                        "so --tee only takes back a --redirects")
    t.add_argument("--log-line-prefix-template", "--log_line_prefix_template", dest="prefix_template",
                   metavar="TEMPLATE", help="the prefix of each rank's lines on the terminal (default "
                                            "'[${role_name}${local_rank}]:'; also ${rank}, ${hostname})")
    t.add_argument("--log-dir", "--log_dir", dest="log_dir", metavar="DIR",
                   help="where the logs go: the run directory (rank<N>.log, supervisor.log ...) is made under DIR, "
                        "as --runs-dir DIR")
    o = p.add_argument_group("torchdeck's own")
    o.add_argument("--name", help="the run's name (default: the script's)")
    o.add_argument("--detach", action="store_true", help="start it and return; watch later with torchdeck attach")
    o.add_argument("--devices", metavar="LIST",
                   help="GPUs to use, e.g. 0,2 or free:N (the N least used): sets each rank's visible GPU")
    o.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment for every rank (repeatable)")
    o.add_argument("--local-rank-arg", "--local_rank_arg", dest="local_rank_arg", action="store_const",
                   const="--local-rank", default="",
                   help="pass --local-rank=N to the script as torch.distributed.launch did "
                        "(--local-rank-arg=--local_rank for the older spelling)")
    o.add_argument(_SPELLING, dest="local_rank_arg", help=argparse.SUPPRESS)  # --local-rank-arg=FLAG (parse)
    o.add_argument("--runs-dir", metavar="DIR", help="where runs live (default $TORCHDECK_RUNS or ./runs)")
    o.add_argument("--debug", action="store_true", help="show tracebacks of torchdeck's own errors")
    for names in UNSUPPORTED:
        p.add_argument(*names, action=_Unsupported)
    p.add_argument("script", metavar="SCRIPT", help="your script (or module with -m, executable with --no-python)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments, unchanged")
    return p


_SPELLING = "--local-rank-spelling"

_STD_ONE, _STD_MAP = re.compile(r"[0-3]"), re.compile(r"(\d+:[0-3],)*\d+:[0-3]")  # torchrun's Std.from_str


def _std(text: str, flag: str):
    """torchrun's stream spec: 0-3 for every local rank, or `0:3,1:1` per local rank (a dict)."""
    text = str(text).strip()
    if _STD_ONE.fullmatch(text):
        return int(text)
    if _STD_MAP.fullmatch(text):
        return {int(k): int(v) for k, v in (item.split(":") for item in text.split(","))}
    raise UsageError(f"torchdeck launch: {flag} {text}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both) "
                     f"for every rank, or per local rank like 0:3,1:1")


DEFAULT_PREFIX = "[${role_name}${local_rank}]:"  # torchrun's for a tee'd line: [default0]:


@dataclass(frozen=True)
class OutputRule:
    """Which local ranks' output the terminal shows (torchrun's --local-ranks-filter, --redirects,
    --tee). Every rank's output is in its rank<N>.log whatever the rule says."""
    redirects: object = 0  # int, or {local rank: int}; bit 1 stdout, bit 2 stderr
    tee: object = 0
    ranks: frozenset | None = None  # --local-ranks-filter; None: every rank
    template: str = DEFAULT_PREFIX  # --log-line-prefix-template

    def prefix(self, local_rank: int, rank: int, host: str) -> str:
        return string.Template(self.template).safe_substitute(role_name="default", local_rank=local_rank, rank=rank,
                                                              hostname=host)

    def shows(self, local_rank: int) -> bool:
        """The rank's lines reach the terminal: it passes the filter and its stdout is not
        redirected without a tee. stderr shares stdout's file, so it follows stdout."""
        if self.ranks is not None and local_rank not in self.ranks:
            return False
        def at(spec):
            return spec.get(local_rank, 0) if isinstance(spec, dict) else spec
        return bool((~at(self.redirects) | at(self.tee)) & 1)


def output_rule(args: argparse.Namespace) -> OutputRule:
    ranks = None
    text = getattr(args, "local_ranks_filter", None)
    if text is not None:
        try:
            ranks = frozenset(int(r) for r in str(text).split(","))
        except ValueError:
            raise UsageError(f"torchdeck launch: --local-ranks-filter {text}: expected local ranks separated by "
                             f"commas, like 0 or 0,1") from None
    template = getattr(args, "prefix_template", None) or os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") \
        or DEFAULT_PREFIX  # torchrun's order: the flag, then its environment variable
    return OutputRule(_std(getattr(args, "redirects", "0"), "--redirects"), _std(getattr(args, "tee", "0"), "--tee"),
                      ranks, template)


def runs_dir(args: argparse.Namespace) -> str | None:
    """Where the run directory goes: --runs-dir, or torchrun's --log-dir (the same folder, said the
    torchrun way: each run's logs in a directory of its own under it)."""
    log_dir, runs = getattr(args, "log_dir", None), getattr(args, "runs_dir", None)
    if log_dir and runs and Path(log_dir).resolve() != Path(runs).resolve():
        raise UsageError(f"torchdeck launch: --log-dir {log_dir} and --runs-dir {runs} disagree: both say where the "
                         f"run directory (with rank<N>.log) goes; give one")
    return log_dir or runs


def parse(argv: list[str], p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse a launch's command line. `--local-rank-arg` alone is a switch (a value after it would
    take the script's place); `--local-rank-arg=--local_rank` names the spelling. Only the options
    before the script are looked at: everything after it is the script's own."""
    p = p or parser()
    argv, i = list(argv), 0
    while i < len(argv):
        tok = argv[i]
        name, eq, value = tok.partition("=")
        if eq and name in ("--local-rank-arg", "--local_rank_arg"):
            argv[i] = f"{_SPELLING}={value}"
        elif tok == "--" or not tok.startswith("-"):
            break  # the script: the rest is its own
        elif not eq:
            action = p._option_string_actions.get(tok)
            if action is not None and action.nargs is None:  # an option with a value: skip the value
                i += 1
        i += 1
    return p.parse_args(argv)


def _nnodes(text: str) -> int:
    lo, sep, hi = str(text).partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise UsageError(f"torchdeck launch: --nnodes {text}: expected a number of nodes, like 2") from None
    if low != high:
        raise UsageError(f"torchdeck launch: --nnodes {text} is an elastic range: torchdeck runs a fixed number of "
                         f"nodes; give --nnodes N")
    return low


def _processes(nproc: str | None, devices: str | None, gpu_count) -> tuple[str, object]:
    """(accelerator, devices) for --nproc-per-node and --devices. gpu_count: this host's visible
    GPUs (an int, or a callable giving one, asked only for `auto`)."""
    if devices:
        count = None
        if not devices.replace(" ", "").startswith("free:"):
            count = len([d for d in devices.split(",") if d.strip()])
        else:
            tail = devices.replace(" ", "")[5:]
            count = int(tail) if tail.isdigit() else None
        if nproc not in (None, "gpu", "auto") and count is not None and nproc != str(count):
            raise UsageError(f"torchdeck launch: --nproc-per-node {nproc} and --devices {devices} disagree: one "
                             "process per picked GPU; leave out --nproc-per-node")
        return "cuda", devices
    if nproc is None:
        return "cpu", 1
    if nproc == "auto":
        n = gpu_count() if callable(gpu_count) else gpu_count
        nproc = "gpu" if n else "cpu"
    if nproc == "gpu":
        n = gpu_count() if callable(gpu_count) else gpu_count
        if n == 0:
            raise UsageError("torchdeck launch: --nproc-per-node gpu: this host has no GPU that CUDA can use; give a "
                             "number of processes, or cpu")
        return "cuda", -1  # every visible GPU
    if nproc == "cpu":
        return "cpu", "auto"  # one per core this process may use (torchrun's: os.cpu_count())
    try:
        n = int(nproc)
    except ValueError:
        raise UsageError(f"torchdeck launch: --nproc-per-node {nproc}: expected a number, gpu, cpu or auto") from None
    if n < 1:
        raise UsageError(f"torchdeck launch: --nproc-per-node {nproc}: at least 1 process")
    return "cpu", n  # N processes; the script picks its device from LOCAL_RANK, as under torchrun


def to_config(args: argparse.Namespace, cwd: str | Path, gpu_count=None) -> dict:
    """The script run's config dict (engine.config's shape) for parsed `args`; cwd: where the
    script runs (the folder launch was called from). Raises UsageError for flags that do not go
    together; the config's own rules are engine.preflight's."""
    env = {}
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"torchdeck launch: --env {item}: expected NAME=VALUE")
        env[key] = value
    if args.use_env and args.local_rank_arg:
        raise UsageError("torchdeck launch: --use-env and --local-rank-arg disagree: --use-env gives the rank in the "
                         "environment only; leave out one of them")
    if args.module and args.no_python:
        raise UsageError("torchdeck launch: -m and --no-python disagree: a module runs with python; leave out one")
    nnodes = _nnodes(args.nnodes)
    if args.standalone and nnodes != 1:
        raise UsageError(f"torchdeck launch: --standalone is one node, and --nnodes says {args.nnodes}")
    accelerator, devices = _processes(args.nproc, args.devices, gpu_count)
    port = args.master_port
    if port is None or args.standalone:
        port = 0 if nnodes == 1 else 29500  # one node: a free port, as torchrun --standalone
    target = args.script
    name = args.name or (target.rsplit(".", 1)[-1] if args.module else Path(target).stem) or "script"
    return {
        "name": name,
        "strategy": "script",
        "accelerator": accelerator,
        "devices": devices,
        "train": {"max_restarts": args.max_restarts},
        "nodes": {"num_nodes": nnodes, "node_rank": args.node_rank,
                  "master_addr": "127.0.0.1" if args.standalone else args.master_addr, "master_port": port},
        "script": {"path": "" if args.module else target, "module": target if args.module else "",
                   "args": list(args.args), "no_python": bool(args.no_python),
                   "local_rank_arg": args.local_rank_arg or "", "env": env, "cwd": str(Path(cwd).resolve())},
    }


def lines(problems) -> list[str]:
    """Problems with a launch's config, in the flags' words: `--nnodes: ...`; the script's own
    (missing, syntax error) as they are."""
    out = []
    if any(f == "accelerator" and "cuda needs" in why for f, why in problems):  # the one thing to say
        problems = [("", "--devices picks GPUs, and this host has no GPU that CUDA can use (no NVIDIA GPU or "
                         "driver); leave out --devices and give --nproc-per-node N")]
    for field, why in problems:
        if field.startswith("script.") and field not in FLAG_OF:
            out.append(f"torchdeck launch: {why}")
        else:
            out.append(f"torchdeck launch: {FLAG_OF.get(field, field)}: {why}" if field else f"torchdeck launch: {why}")
    return out
