"""`torchdeck run|launch --slurm`, and attach/runs/stop of a run submitted to SLURM.

SLURM's own flag names (--nodes, --partition, ...) become the config's slurm section and
nodes.num_nodes, so that a preset and the command line say the same thing two ways. After sbatch
the job is followed from the login node as a local run is: SLURM's state while it waits (squeue's
reason), node 0's events once it runs (the run directory is on the shared filesystem), SLURM's
state at its end. The engine does the work (engine/slurm/); this is its front end.
"""
from __future__ import annotations

import json
import time

from ..engine.errors import UsageError

# (flag, config key, type): the sbatch flag names, which users know from their cluster's docs
FLAGS = (("--nodes", "nodes.num_nodes", int), ("--gpus-per-node", "slurm.gpus_per_node", int),
         ("--partition", "slurm.partition", str), ("--time", "slurm.time", str),
         ("--account", "slurm.account", str), ("--qos", "slurm.qos", str), ("--constraint", "slurm.constraint", str))
PENDING_POLL_S = 1.0  # squeue is asked this often while the job waits
END_WAIT_S = 30.0  # after the run ended, how long SLURM may take to call the job over (COMPLETING)


def add_flags(parser) -> None:
    """--slurm and the sbatch flags, on `run`'s parser and on `launch`'s own."""
    g = parser.add_argument_group("SLURM (submit the run as a batch job: one torchdeck supervisor per node)")
    g.add_argument("--slurm", action="store_true", help="submit to SLURM with sbatch, then follow the job")
    for flag, key, kind in FLAGS:
        g.add_argument(flag, dest="slurm_" + key.split(".")[1], type=kind, metavar="N" if kind is int else "VALUE",
                       help=f"sbatch's {flag} ({key})")
    g.add_argument("--sbatch-arg", dest="sbatch_args", action="append", metavar="OPT",
                   help="any other sbatch option, as sbatch takes it: --sbatch-arg=--mem=64G (repeatable; slurm.sbatch_args)")


def overrides(args) -> list[str]:
    """The flags given as `--set` values; UsageError for a SLURM flag without --slurm."""
    out = []
    for flag, key, _ in FLAGS:
        value = getattr(args, "slurm_" + key.split(".")[1], None)
        if value is not None:
            out.append(f"{key}={value}")
    if getattr(args, "sbatch_args", None):
        out.append(f"slurm.sbatch_args={json.dumps(args.sbatch_args)}")
    if out and not getattr(args, "slurm", False):
        given = [f for f, key, _ in FLAGS if any(o.startswith(key + "=") for o in out)] + (
            ["--sbatch-arg"] if args.sbatch_args else [])
        raise UsageError(f"{', '.join(given)}: SLURM flags; add --slurm to submit the run as a SLURM job "
                         "(on this host: leave them out, or set nodes.num_nodes with --set)")
    return out


def check(cfg) -> None:
    """What would make the submission fail, said before anything is made (exit 2)."""
    from ..engine.slurm import submit

    if cfg.nodes.node_rank:
        raise UsageError("--node-rank: SLURM gives each node its rank; leave it out with --slurm")
    problems = submit.check(cfg)
    if problems:
        raise UsageError(*problems)


def submit(args, cfg, origin: dict):
    """sbatch the run (what would fail said first, exit 2); its RunDir. Says the job and where its
    run directory is, and with --detach how to watch it."""
    from ..engine.slurm import submit
    from ..engine.slurm.cluster import SlurmError

    check(cfg)
    try:
        run = submit.submit(cfg, root=args.runs_dir, origin=origin)
    except SlurmError as exc:
        raise UsageError(f"SLURM refused the job: {exc.message}") from None
    except OSError as exc:
        raise UsageError(f"cannot create the run directory under {args.runs_dir or './runs'}: "
                         f"{exc.strerror or exc}") from None
    job = run.slurm["job_id"]
    where = f"partition {cfg.slurm.partition}" if cfg.slurm.partition else "the default partition"
    print(f"submitted SLURM job {job} ({cfg.nodes.num_nodes} node(s), {where})\nrun directory: {run.path}", flush=True)
    if args.detach:
        print(f"the job runs without this shell; watch it with: torchdeck attach {run.path}\n"
              f"stop it with: torchdeck stop {run.path}", flush=True)
    return run


def wait_to_run(run, ints, attached: bool) -> bool:
    """Say SLURM's state while the job waits, each change once; False when the user left (Ctrl-C on
    attach detaches; on run/launch it cancels the waiting job: there is nothing to checkpoint yet).
    ints: the CLI's Ctrl-C counter."""
    from ..engine.runs import control

    job, said = run.slurm["job_id"], None
    while run.final_status() is None:
        st = run.job_state()
        if st is None or not st.pending:
            break
        line = f"SLURM job {job}: {st.state}" + (f" ({st.reason})" if st.reason else "")
        if line != said:
            print(line, flush=True)
            said = line
        if ints.count > ints.handled:
            ints.handled = ints.count
            if attached:
                return False
            control.cancel_job(run)  # recorded stopped, killed: the user's choice, exit 130
            print(f"cancelled SLURM job {job} while it waited", flush=True)
        time.sleep(PENDING_POLL_S)
    st = run.job_state()
    if st is not None and st.active:
        print(f"SLURM job {job}: {st}", flush=True)
    return True


def say_end(run) -> None:
    """SLURM's word on the job once it is over (COMPLETED, FAILED with its exit code, CANCELLED),
    and the job's own output's last lines when torchdeck never recorded why it ended."""
    deadline = time.monotonic() + END_WAIT_S
    st = run.job_state()
    while st is not None and st.active and time.monotonic() < deadline:
        time.sleep(0.5)
        st = run.job_state()
    job = run.slurm["job_id"]
    print(f"SLURM job {job}: {st if st is not None else 'no longer known to SLURM'}", flush=True)


def job_cell(run) -> str | None:
    """`torchdeck runs`' status cell of a SLURM run that waits: pending (SLURM's reason)."""
    st = run.job_state() if run.slurm else None
    if st is None or not st.pending:
        return None
    return "pending" + (f" ({st.reason})" if st.reason else "")
