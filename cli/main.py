"""`torchdeck`: the app with no arguments, and headless commands for everything else.

Starts fast (`--help` must not wait for torch): heavy modules are imported inside the command
that needs them. User mistakes (a broken preset, a missing data root) are one line each on
stderr with exit status 2 and nothing started; `--debug` adds the traceback.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from ..engine.errors import TorchdeckError, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 128 + 13  # the reader of our output left (`| head`): what a shell reports for cat, git, ls


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- config loading


def _overrides(args) -> list[str]:
    overrides = list(args.set or [])
    if getattr(args, "node_rank", None) is not None:
        overrides.append(f"nodes.node_rank={args.node_rank}")
    if getattr(args, "max_restarts", None) is not None:  # torchrun's flag, on `torchdeck run` too
        overrides.append(f"train.max_restarts={args.max_restarts}")
    from . import slurm  # sbatch's flag names (--nodes, --partition, ...) as the values they set

    return overrides + slurm.overrides(args)


def _config_or_usage(args, hw=None, launch: bool = False):
    """The preset and --set values as a validated config with the preflight passed (for a launch
    on this host, its network interfaces too); UsageError, one line per problem naming the field
    and where its value came from, otherwise."""
    from ..engine import preflight

    if hw is None:
        from ..engine.hardware import detect_hardware

        hw = detect_hardware()
    cfg, path = preflight.load_config(args.preset, _overrides(args), hw=hw)
    if str(args.preset).endswith((".yaml", ".yml")):  # a preset file: its folder may hold the user's model.name module
        from ..engine import usercode

        usercode.add_folders(path.parent)
    args.host_notes, args.host_hw = hw.notes, hw  # what was decided from this host (devices: free:N picked which GPUs, why)
    problems = preflight.check(cfg) if launch else preflight.file_problems(cfg)
    if problems:
        raise UsageError(*preflight.lines(problems, str(path), _overrides(args)))
    return cfg


# ----------------------------------------------------------------------------- following a run


SIGINT_COALESCE_S = 0.1  # a SIGINT this soon after the one counted is the same keypress: the
# terminal's and, under `timeout --foreground` (or another wrapper passing it on), the wrapper's copy,
# milliseconds later; a person's second press comes after they read "Ctrl-C again to kill"


class _Interrupts:
    """Counts Ctrl-C instead of raising mid-write; restores the old handler on exit."""

    def __init__(self):
        self.count = 0
        self.handled = 0  # the presses the follower has acted on (follow's `seen`)
        self._old = None
        self._last = float("-inf")

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._hit)
        except ValueError:  # not the main thread: keep the default behaviour
            self._old = None
        return self

    def _hit(self, signum, frame):
        """One more press, unless the last one is not acted on yet or came just now: the same
        keypress delivered twice (one Ctrl-C killed a run under `timeout --foreground`)."""
        now = time.monotonic()
        if self.count == self.handled and now - self._last >= SIGINT_COALESCE_S:
            self.count += 1
            self._last = now

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def follow(run, display, on_interrupt=None, interval: float = 0.2, output=None):
    """Draw the run until it ends; returns its RunView (None when the user detached).
    on_interrupt(n) is called for the n-th Ctrl-C; returning False stops following. output: an
    engine.runs.progress.RankOutput, whose lines (the ranks' own) print above the block."""
    from ..engine.runs.follow import Follower

    follower = Follower(run, outputs=False)
    seen = 0
    try:
        with _Interrupts() as ints:
            follower.stop = lambda: ints.count > ints.handled  # a press: answered within a chunk of a long file
            for _ in follower.follow(interval=interval):
                if output is not None:  # the run over: its last lines, before "run finished" and the summary
                    view = follower.view
                    lines = output.drain(view) if view.final else output.poll(view)
                    if output.cut:
                        display.message(f"(the last {output.HISTORY} lines of each rank's output; all of it in "
                                        f"{run.path}/rank<N>.log)")
                        output.cut = 0
                    display.output(lines)
                display.show(follower.view)
                while ints.count > seen:
                    seen += 1
                    if on_interrupt is not None and on_interrupt(seen) is False:
                        return None
                    ints.handled = seen  # said (its message printed): a press from now on is another
        view = follower.view
        if output is not None:
            display.output(output.drain(view))
        display.finish(view)
    finally:
        display.close()  # the live block stays on screen; the terminal's cursor and print() come back
    if view.status.went_wrong and not view.errors:
        _print_log_tail(run.supervisor_log)
    if follower.skipped:
        print(f"({follower.skipped} line(s) of {run.events_path.name} could not be read and were skipped)")
    return view


def _print_log_tail(path: Path, n: int = 10) -> None:
    try:
        lines = path.read_text(errors="replace").rstrip().splitlines()[-n:]
    except OSError:
        return
    if lines:
        print(f"last lines of {path}:")
        for ln in lines:
            print("    " + ln)


def _exit_for(view) -> int:
    if view is not None and view.killed:
        return view.exit_code()  # the user killed it: 130, as for any command Ctrl-C ended
    return EXIT_OK if view is not None and view.status.ended_well else EXIT_FAILED


# ----------------------------------------------------------------------------- commands


def _origin(args) -> dict:
    return {"preset": args.preset, "overrides": _overrides(args)}


def cmd_run(args) -> int:
    origin = _origin(args)
    if args.resume == "latest":  # the newest earlier run of this config's name (checkpoint.resume: latest)
        args.set = list(args.set or []) + ["checkpoint.resume=latest"]
    elif args.resume:
        from ..engine.runs import control

        old = _find_run(args.resume, args.runs_dir)
        at, ckpt = control.resume_point(old)
        origin.update(resumed_from=str(old.path), checkpoint=str(ckpt))
        args.set = list(args.set or []) + [f"checkpoint.resume={ckpt}"]
    if args.slurm:
        return _submit_run(args, origin)
    cfg = _config_or_usage(args, launch=True)
    if args.resume and args.resume != "latest":
        control.check_left(old, cfg, at, ckpt)  # the same rule as `torchdeck resume`: nothing left, nothing started
    for note in args.host_notes:
        print(note, flush=True)
    if args.host_notes:
        origin["host_notes"] = args.host_notes  # the supervisor logs them: the run says which GPUs and why
    return _launch(args, cfg, origin)


def _login_node_config(args):
    """The config of a job that runs on other hosts (a cluster's login node often has no GPU at all):
    everything checked but this host's GPUs and MPI build."""
    from ..engine.hardware import Hardware

    cfg = _config_or_usage(args, hw=Hardware(gpu_count=None, mpi_available=None))
    if cfg.accelerator == "cuda" and isinstance(cfg.devices, str):
        raise UsageError(f"devices: {cfg.devices}: a job on other hosts cannot know how many GPUs its nodes have; "
                         "list them, e.g. --set 'devices=[0,1,2,3]'")
    return cfg


def _follow_job(run, attached: bool, script_run: bool = False) -> int:
    """Follow a SLURM run from the login node: SLURM's state while it waits, node 0's events while it
    runs (the run directory is on the filesystem both see), SLURM's state at its end."""
    from . import slurm
    from .progress import Display
    from ..engine.kinds import kind_of_run
    from ..engine.runs import control

    job = run.slurm["job_id"]
    with _Interrupts() as ints:
        if not slurm.wait_to_run(run, ints, attached):
            print(f"detached; the job goes on. Re-attach with: torchdeck attach {run.path}", flush=True)
            return EXIT_OK
    kind = kind_of_run(run)

    def on_interrupt(n: int):
        if attached:
            return False
        if n == 1:
            control.request_stop(run)
            print(f"stopping: {kind.stop_wording()}; Ctrl-C again to cancel SLURM job {job}", flush=True)
        else:
            control.cancel_job(run)
            print(f"cancelled SLURM job {job}", flush=True)
        return True

    output = _rank_output(run, _launch_rule(run), whole=not attached) if kind.shows_rank_output else None
    view = follow(run, Display(), on_interrupt, output=output)
    if view is None:
        print(f"detached; the job goes on. Re-attach with: torchdeck attach {run.path}", flush=True)
        return EXIT_OK
    slurm.say_end(run)
    return script_exit_code(view) if script_run or kind.exits_as_torchrun else _exit_for(view)


def _submit_and_follow(args, cfg, origin: dict, script_run: bool = False) -> int:
    from . import slurm

    run = slurm.submit(args, cfg, origin)
    return EXIT_OK if args.detach else _follow_job(run, attached=False, script_run=script_run)


def _submit_run(args, origin: dict) -> int:
    """`torchdeck run PRESET --slurm`: submitted as a batch job, then followed from here (--resume's
    checkpoint is on the filesystem the nodes share)."""
    return _submit_and_follow(args, _login_node_config(args), origin)


def cmd_launch(args) -> int:
    """`torchdeck launch [torchrun's flags] script.py [args...]`: the user's own script as a run
    (strategy script), followed as `torchdeck run` follows one; exits with the script's code."""
    from ..engine import config as cfgmod
    from ..engine import preflight
    from ..engine.hardware import detect_hardware
    from ..engine.launch import args as launch_args

    import argparse

    from . import slurm

    flags = argparse.ArgumentParser(add_help=False)
    slurm.add_flags(flags)
    try:
        ns = launch_args.parse(args.argv, launch_args.parser(parents=(flags,)))
    except SystemExit as exc:  # --help
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    if ns.slurm:
        return _submit_launch(args, ns)
    args.debug = getattr(args, "debug", False) or ns.debug
    args.output_rule = launch_args.output_rule(ns)  # torchrun's --tee/--redirects/--local-ranks-filter
    args.runs_dir = launch_args.runs_dir(ns)  # --runs-dir, or torchrun's --log-dir
    hw = detect_hardware()
    data = launch_args.to_config(ns, os.getcwd(), gpu_count=lambda: hw.gpu_count or 0)
    try:
        cfg = preflight.from_dict(data, hw=hw)
    except cfgmod.ConfigError as exc:
        raise UsageError(*launch_args.lines(exc.problems)) from None
    problems = preflight.check(cfg)
    if problems:
        raise UsageError(*launch_args.lines(problems))
    for note in hw.notes:
        print(note, flush=True)
    origin = {"launch": ["torchdeck", "launch", *args.argv]}
    if hw.notes:
        origin["host_notes"] = hw.notes
    args.detach = ns.detach
    return _launch(args, cfg, origin)


def _submit_launch(args, ns) -> int:
    """`torchdeck launch --slurm ... train.py`: the user's script as a batch job, one supervisor per node."""
    from . import slurm
    from ..engine import config as cfgmod
    from ..engine import preflight
    from ..engine.launch import args as launch_args

    args.debug = getattr(args, "debug", False) or ns.debug
    args.runs_dir = launch_args.runs_dir(ns)
    if ns.slurm_num_nodes is not None and ns.nnodes not in ("1", str(ns.slurm_num_nodes)):
        raise UsageError(f"torchdeck launch: --nodes {ns.slurm_num_nodes} and --nnodes {ns.nnodes} disagree; give one")
    if ns.slurm_num_nodes is not None:
        ns.nnodes = str(ns.slurm_num_nodes)  # the master port then is one every node uses (node.py: the job's own)
    data = launch_args.to_config(ns, os.getcwd(), gpu_count=None)
    try:
        cfgmod.apply_overrides(data, slurm.overrides(ns))
        cfg = preflight.from_dict(data)
    except cfgmod.ConfigError as exc:
        raise UsageError(*launch_args.lines(exc.problems)) from None
    problems = preflight.file_problems(cfg)  # the script, on the filesystem the nodes share; not this host's GPUs
    if problems:
        raise UsageError(*launch_args.lines(problems))
    args.detach = ns.detach
    return _submit_and_follow(args, cfg, {"launch": ["torchdeck", "launch", *args.argv]}, script_run=True)


def script_exit_code(view) -> int:
    """A script run's exit code, the script's (RunView.exit_code: 0 when it ended well, else the
    first failing rank's code, a signal's death as 128 + N); 1 while it is not over (detached)."""
    code = view.exit_code() if view is not None else None
    return EXIT_FAILED if code is None else code


def _launch(args, cfg, origin: dict, root=None) -> int:
    from .progress import Display
    from ..engine.runs import control
    from ..engine.kinds import kind_of

    kind = kind_of(cfg)
    if cfg.accelerator == "cuda":
        from ..engine.hardware import visible_devices_warning

        warn = visible_devices_warning()
        if warn:
            _err("warning: " + warn)
    if kind.ranks_from_shim:  # the folder the ranks start in, as the run records it
        from ..engine.preflight import script_cwd

        cfg.script.cwd = str(script_cwd(cfg).resolve())
    root = root or args.runs_dir
    try:  # cfg was validated where it was made: the supervisor and its ranks trust it (engine/rundir/config.py)
        run = control.start(cfg, root=root, origin=origin)
    except OSError as exc:
        where = root or os.environ.get("TORCHDECK_RUNS") or "./runs"
        raise UsageError(f"cannot create the run directory under {where}: {exc.strerror or exc}") from None
    print(f"run directory: {run.path}", flush=True)
    if args.detach:
        print(f"running in the background; watch it with: torchdeck attach {run.path}\n"
              f"stop it with: torchdeck stop {run.path}")
        return EXIT_OK

    display = Display()

    def on_interrupt(n: int):  # said through the display: above its live block, wrapped at its width
        if n == 1:
            control.request_stop(run)
            display.message(f"stopping: SIGTERM to the ranks, SIGKILL after {cfg.script.stop_grace_s:g} s; "
                            "Ctrl-C again to kill" if kind.is_script else
                            "stopping: finishing the step and checkpointing; Ctrl-C again to kill")
        else:
            pids = control.kill(run)
            display.message(f"killed {len(pids)} process(es) of the run")
        return True

    view = follow(run, display, on_interrupt, output=_rank_output(run, getattr(args, "output_rule", None), True)
                  if kind.shows_rank_output else None)
    return script_exit_code(view) if kind.exits_as_torchrun else _exit_for(view)


def _rank_output(run, rule=None, whole: bool = True):
    """What a script run's ranks print, for the terminal (torchrun prints it where it was typed)."""
    from ..engine.runs.progress import RankOutput

    return RankOutput(run, rule, whole)


def _launch_rule(run):
    """The --local-ranks-filter/--redirects/--tee a `torchdeck launch` was given, for attach to show
    the same ranks' output; None (all) for anything else."""
    argv = run.origin().get("launch")
    if not isinstance(argv, list) or argv[:2] != ["torchdeck", "launch"]:
        return None
    from ..engine.launch import args as launch_args

    try:
        return launch_args.output_rule(launch_args.parse([str(a) for a in argv[2:]]))
    except (UsageError, SystemExit):
        return None


def cmd_resume(args) -> int:
    """`torchdeck resume RUN`: a new run that continues RUN from its newest checkpoint."""
    from ..engine.runs import control

    run = _find_run(args.run, args.runs_dir)
    cfg, origin, step, ckpt = control.resume_config(run, args.set)
    print(f"resuming {run.name} from {ckpt.name} (step {step})", flush=True)
    return _launch(args, cfg, origin, root=args.runs_dir or run.path.parent)


def _find_run(ref: str, runs_dir: str | None):
    from ..engine.runs.catalog import find_run

    return find_run(ref, Path(runs_dir) if runs_dir else None)


def cmd_attach(args) -> int:
    from .progress import Display

    run = _find_run(args.run, args.runs_dir)
    status = run.status()
    from ..engine import fmt

    if status.live and run.slurm is not None:  # waiting in SLURM's queue, or running on its nodes
        from . import slurm

        print(fmt.wrap(f"attached to {run.path}, SLURM job {run.slurm['job_id']} (Ctrl-C detaches; the job goes "
                       "on)", _terminal_width()), flush=True)
        return _follow_job(run, attached=True)
    if status.live:
        print(fmt.wrap(f"attached to {run.path} (Ctrl-C detaches; the run goes on)", _terminal_width()), flush=True)
    else:  # its history only: nothing goes on after Ctrl-C
        print(fmt.wrap(f"{run.path}: the run is over ({status}); its history:", _terminal_width()), flush=True)

    view = follow(run, Display(), lambda n: False, output=_rank_output(run, _launch_rule(run), whole=False))
    if view is None:  # said below the block, now closed (above it, the frozen block read as still live)
        print(fmt.wrap(f"detached; the run goes on. Re-attach with: torchdeck attach {run.path}",
                       _terminal_width()), flush=True)
        return EXIT_OK
    return _exit_for(view)


def cmd_runs(args) -> int:
    from ..engine import fmt
    from ..engine.runs.catalog import NARROW_DROP, collect, columns
    from ..engine.rundir.layout import SLURM_FILE, RunDir, runs_root

    root = Path(args.runs_dir).resolve() if args.runs_dir else runs_root()
    rows = collect(root)
    if not rows:
        print(f"no runs under {root}")
        return EXIT_OK
    cells = [r.cells() for r in rows]
    for r, c in zip(rows, cells):
        if r.is_live and (r.path / SLURM_FILE).is_file():  # a SLURM job that waits: SLURM's reason
            from . import slurm

            c["status"] = slurm.job_cell(RunDir(r.path)) or c["status"]
    cols = [(k, label) for k, label in columns(rows) if any(c[k] for c in cells)]  # no empty columns
    print("\n".join(fmt.fit_table(cols, cells, _terminal_width(), NARROW_DROP)))
    for r in rows:
        if r.root_cause and r.status.ended_early:  # wrapped between words: a terminal cut `ru` / `n)`
            print(fmt.wrap(f"{r.key}: {r.root_cause}", _terminal_width()))
    print(f"({root})")
    return EXIT_OK


def cmd_compare(args) -> int:
    """`torchdeck compare PRESET --strategies a,b,c`: the same job under each strategy, one after
    another, then one table (engine.runs.compare computes it; the app's Compare screen shows the same)."""
    from .progress import Display
    from ..engine.runs import compare, control
    from ..engine import fmt

    strategies = [s.strip() for s in (args.strategies or "").split(",") if s.strip()]
    if args.save_best:
        from ..engine import presets

        presets.check_name(args.save_best)
        if presets.user_preset_path(args.save_best).exists():
            raise UsageError(f"--save-best: user preset {args.save_best!r} exists "
                             f"({presets.user_preset_path(args.save_best)}); pick another name or delete it")
    if args.target_acc is not None and not 0 < args.target_acc <= 1:
        raise UsageError(f"--target-acc: a validation accuracy between 0 and 1 (0.8 for 80%), got {args.target_acc:g}")
    from ..engine.runs.metric import parse_target

    try:  # --target val_loss<=1.6 (any metric); --target-acc X is --target val_acc>=X
        target = parse_target(args.target) if args.target is not None else (
            None if args.target_acc is None else parse_target(args.target_acc))
    except UsageError as exc:
        raise UsageError(f"--target: {exc}") from None
    facts, entries = compare.plan(args.preset, strategies, _overrides(args), args.steps, args.epochs, target=target)
    try:
        path = compare.new_dir(facts["name"], Path(args.runs_dir) if args.runs_dir else None)
    except OSError as exc:
        raise UsageError(f"cannot create the comparison directory: {exc.strerror or exc}") from None
    compare.write_plan(path, facts, entries, target)
    for line in compare.header_lines(facts):
        print(fmt.wrap(line, _terminal_width()))
    print(f"comparison directory: {path}", flush=True)
    todo = [i for i, e in enumerate(entries) if not e.skipped]
    for e in entries:
        if e.skipped:
            print(fmt.wrap(f"{e.strategy}: skipped: {e.skipped}", _terminal_width()))
    stopping = []

    def watch(i: int, run) -> None:
        print(f"[{todo.index(i) + 1}/{len(todo)}] {entries[i].strategy}: {run.path.name}", flush=True)

        display = Display()

        def on_interrupt(n: int):  # through the display: above its live block, wrapped at its width
            stopping.append(n)
            if n == 1:
                control.request_stop(run)
                display.message("stopping this run and the comparison (the rows so far are kept); "
                                "Ctrl-C again to kill")
            else:
                display.message(f"killed {len(control.kill(run))} process(es) of the run")
            return True

        follow(run, display, on_interrupt)

    comparison = compare.execute(path, facts, entries, watch, stopping=lambda: bool(stopping))
    print()
    for line in compare.table_lines(comparison.rows, comparison.target, _terminal_width()):
        print(fmt.wrap(line, _terminal_width()))  # the table fits already; the reasons below it wrap
    print(f"written: {path / compare.TABLE_FILE}, {path / compare.PLAN_FILE}")
    if comparison.error:  # a target no run reports: said once, exit 2, nothing saved
        raise UsageError(comparison.error)
    if args.save_best:
        best = compare.fastest(comparison)
        if best is None:
            print(f"--save-best: no strategy finished{' at the target ' + comparison.target.text if comparison.target else ''}; "
                  "nothing saved")
        else:
            from ..engine.presets import save_user_preset

            entry = next(e for e in entries if e.strategy == best.strategy)
            saved = save_user_preset(entry.preset_cfg, args.save_best)
            print(f"saved the fastest, {best.strategy}, as user preset {args.save_best} ({saved}); "
                  f"launch it with: torchdeck run user:{args.save_best}")
    from ..engine.rundir.status import Status

    ran = [r for r in comparison.rows if r.status != compare.SKIPPED]
    return EXIT_OK if ran and all(Status.of_final(r.status).ended_well for r in ran) else EXIT_FAILED


def cmd_tune(args) -> int:
    """`torchdeck tune PRESET --batch-size`: the largest batch per process that trains without running
    out of memory on any rank, found by short trial runs (engine.runs.tune)."""
    from ..engine import presets
    from ..engine.runs import control, tune

    if not args.batch_size:
        raise UsageError("say what to tune: --batch-size (the largest batch that fits on the GPUs)")
    if args.save:
        presets.check_name(args.save)
        own = presets.user_preset_path(args.save)
        if own.exists() and presets.resolve(args.preset) != own:
            raise UsageError(f"--save: user preset {args.save!r} exists ({own}); pick another name, "
                             f"or tune that preset (torchdeck tune {args.save} --batch-size --save {args.save})")
    current: list = []

    def watch(batch: int, run) -> None:
        current.append(run)
        print(f"trying batch {batch} per process ({args.steps} steps): {run.path.name}", flush=True)

    try:
        path, result = tune.search(args.preset, _overrides(args), steps=args.steps, max_batch=args.max_batch,
                                   max_trials=args.max_trials, root=Path(args.runs_dir) if args.runs_dir else None,
                                   watch=watch)
    except KeyboardInterrupt:
        if current and current[-1].final_status() is None:
            print(f"killed {len(control.kill(current[-1]))} process(es) of the trial", flush=True)
        raise
    print()
    for line in tune.lines(result):
        print(line)
    print(f"written: {path / tune.RESULT_FILE}")
    b = result["best"]
    if b is None:
        return EXIT_FAILED
    if args.save:
        from ..engine import preflight

        cfg, _ = preflight.load_config(args.preset, _overrides(args) + [f"train.batch_size={b}"])
        saved = presets.save_user_preset(cfg, args.save, overwrite=True)
        print(f"saved as user preset {args.save} with train.batch_size={b} ({saved}); "
              f"launch it with: torchdeck run {args.save}")
    else:
        print(f"use it: torchdeck run {args.preset} --set train.batch_size={b}   "
              f"(or add --save NAME here to keep it in a user preset)")
    return EXIT_OK


def cmd_stop(args) -> int:
    from ..engine.runs import control
    from ..engine.kinds import kind_of_run, stop_grace_of

    run = _find_run(args.run, args.runs_dir)
    status = run.status()
    if not status.live:
        print(f"run {run.name} is not running (status: {status})")
        return EXIT_FAILED
    if run.slurm is not None:
        return _stop_job(args, run)
    if args.kill:
        pids = control.kill(run)
        print(f"killed {len(pids)} process(es) of run {run.name}")
        return EXIT_OK
    control.request_stop(run)
    print(f"stop requested for {run.name}: {kind_of_run(run).stop_wording(stop_grace_of(run))}, "
          f"then all exit (`torchdeck stop --kill {run.name}` if it does not)")
    if args.wait:
        final = control.wait(run, timeout=args.wait)
        if final is None:
            print(f"still running after {args.wait:g} s")
            return EXIT_FAILED
        return _stopped_exit(final)
    return EXIT_OK


def _stopped_exit(final: dict) -> int:
    """What `torchdeck stop --wait` says and exits with once the run ended (a local or a SLURM run)."""
    print(f"run {final.get('status')}")
    from ..engine.rundir.status import Status

    return EXIT_OK if Status.of_final(final.get("status")).ended_well else EXIT_FAILED


def _stop_job(args, run) -> int:
    """stop/stop --kill of a SLURM run: the stop file, then scancel after the grace period; --kill: scancel."""
    from ..engine.runs import control
    from ..engine.kinds import kind_of_run, stop_grace_of

    job = run.slurm["job_id"]
    if args.kill:
        control.cancel_job(run)
        print(f"cancelled SLURM job {job} (run {run.name})")
        return EXIT_OK
    grace = control.SLURM_STOP_GRACE_S + (stop_grace_of(run) or 0.0)
    print(f"stop requested for {run.name}: {kind_of_run(run).stop_wording(stop_grace_of(run))}, then all exit; "
          f"SLURM job {job} is cancelled if it has not ended within {grace:g} s", flush=True)
    final = control.stop_job(run, grace, on_cancel=lambda why: print(f"cancelling SLURM job {job}: {why}", flush=True))
    if final is None and args.wait:
        final = control.wait(run, timeout=args.wait)
    if final is None:
        print(f"SLURM job {job} is cancelled; its nodes are ending it")
        return EXIT_OK
    return _stopped_exit(final)


def cmd_stacks(args) -> int:
    """`torchdeck stacks RUN`: where every rank of this node (and the supervisor) is right now,
    grouped by place; for a run that is over, the last stacks recorded (its watchdog's, or the
    ones asked for)."""
    from ..engine.rundir import stacks

    run = _find_run(args.run, args.runs_dir)
    if run.is_live():
        groups, taken = stacks.take(run)
        if not taken:
            print(f"run {run.name}: no process of it on this host answers yet (ranks register once started)")
            return EXIT_FAILED
        print(f"stacks of {run.name}: {len(taken)} process(es) on this host, {time.strftime('%H:%M:%S')}")
    else:
        last = stacks.last_recorded(run)  # the watchdog's event, or the files `t` / a live `stacks` left
        if last is None:
            print(f"run {run.name} is not running (status: {run.status()}) and took no stacks")
            return EXIT_FAILED
        groups = last["groups"]
        when = time.strftime("%H:%M:%S", time.localtime(last["t"]))
        files = f"; {', '.join(last['files'])}" if last["files"] else ""
        print(f"run {run.name} is not running (status: {run.status()}); the stacks last recorded at {when} "
              f"({last['reason']}{files}):")
    for line in stacks.render(groups, depth=args.depth):
        print(line)
    return EXIT_OK


def _item(text: str) -> None:
    """One indented item of a report; in a terminal, wrapped at its edge under its own indent
    (a wrapped line at column 0 reads as the next item)."""
    from ..engine import fmt

    print(fmt.wrap("  " + text, _terminal_width()))


def _terminal_width() -> int | None:
    """The terminal's columns when printing to one; None (no limit) into a pipe or a file."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def cmd_presets(args) -> int:
    from ..engine.presets import DEFAULT_PRESET, list_presets, user_presets_dir
    from ..engine import fmt

    infos = list_presets()
    shipped = {i.name for i in infos if i.source == "shipped"}
    cells = []
    for i in infos:
        name = i.name + (" (default)" if i.name == DEFAULT_PRESET and i.source == "shipped" else "")
        if i.source == "user" and i.name in shipped:
            name += f" (use user:{i.name})"
        cells.append({"name": name, "source": i.source, "strategy": i.strategy, "description": i.description})
    cols = [("name", "NAME"), ("source", "SOURCE"), ("strategy", "STRATEGY"), ("description", "DESCRIPTION")]
    print("\n".join(fmt.fit_table(cols, cells, _terminal_width())))  # a description longer is cut
    print(f"user presets: {user_presets_dir()}")
    return EXIT_OK


def cmd_validate(args) -> int:
    from ..engine import preflight
    from ..engine.hardware import visible_devices_warning
    from ..engine.kinds import kind_of

    cfg = _config_or_usage(args)
    kind = kind_of(cfg)
    if args.memory and not kind.can_estimate_memory:
        raise UsageError(kind.does_not_apply("validate --memory", kind.no_memory_estimate))
    print(f"{args.preset}: valid")
    for line in preflight.describe(cfg) + args.host_notes:
        _item(line)
    warnings = [f"{f}: {why} (a launch on this host would be refused)" for f, why in preflight.host_problems(cfg)]
    if cfg.accelerator == "cuda" and visible_devices_warning():
        warnings.append(visible_devices_warning())
    warnings += [f"{field}: {why}" for field, why in preflight.advice(cfg)]  # valid, but probably not meant
    for w in warnings:
        _item("warning: " + w)
    if args.memory:
        from ..engine import memory

        for line in memory.lines(cfg, getattr(args, "host_hw", None)):
            _item(line)
    if args.explain:
        from ..engine import presets

        from ..engine import fmt

        for line in preflight.explain(args.preset, _overrides(args), cfg, presets.resolve(args.preset)):
            print(fmt.wrap(line, _terminal_width()))  # paths whole (fmt.wrap), never cut by the terminal
    return EXIT_OK


def _fresh_tensorboard_dir(tb: Path) -> None:
    """--tensorboard DIR must be a folder without event files: TensorBoard reads every file in it,
    so a second export there would show each step twice."""
    if tb.exists() and not tb.is_dir():
        raise UsageError(f"--tensorboard {tb}: that is a file; TensorBoard writes a folder of event files: give a folder")
    if any(tb.glob("*tfevents*")):
        raise UsageError(f"--tensorboard {tb}: that folder already holds TensorBoard event files, and TensorBoard "
                         "would show each step twice; give a new folder or delete them first")


def cmd_metrics(args) -> int:
    from ..engine import metrics

    if not args.csv and not args.tensorboard:
        raise UsageError("torchdeck metrics: say where: --csv FILE and/or --tensorboard DIR")
    run = _find_run(args.run, args.runs_dir)
    if args.tensorboard and not metrics.tensorboard_available():
        raise UsageError("--tensorboard: the tensorboard package is not installed (pip install tensorboard); "
                         "--csv works without it")
    if args.tensorboard:
        _fresh_tensorboard_dir(Path(args.tensorboard))
    to_stdout = args.csv == "-"  # as for most tools: the CSV on stdout, for a pipe (| head, pandas)
    sink = metrics.convert(run.events_path, Path(args.csv) if args.csv and not to_stdout else None,
                           Path(args.tensorboard) if args.tensorboard else None,
                           stream=sys.stdout if to_stdout else None)
    where = " and ".join(x for x in ("stdout" if to_stdout else args.csv, args.tensorboard) if x)
    print(f"{run.name}: {sink.rows} metric rows written to {where}", file=sys.stderr if to_stdout else sys.stdout)
    return EXIT_OK


def cmd_eval(args) -> int:
    ckpt = Path(args.checkpoint).expanduser()
    if not ckpt.exists() or (ckpt / "config.yaml").is_file():  # a run (directory, name, 'latest'): its newest checkpoint
        try:
            run = _find_run(args.checkpoint, getattr(args, "runs_dir", None))
        except UsageError:
            raise UsageError(f"{args.checkpoint}: no such checkpoint file or run (give a ckpt-* file or folder, a run "
                             "directory, or 'latest')") from None
        from ..engine.kinds import kind_of_run

        kind = kind_of_run(run)
        if not kind.can_eval:
            raise UsageError(kind.does_not_apply("eval", kind.no_eval, run.name))
        found = run.newest_checkpoint()
        if found is None:
            raise UsageError(f"run {run.name} has no checkpoint (it ended before its first one)")
        ckpt = found[1]
    if args.data_root and not Path(args.data_root).expanduser().exists():
        raise UsageError(f"--data-root: no such folder {args.data_root!r}")
    from ..engine.evaluate import evaluate

    res = evaluate(str(ckpt), data_root=args.data_root)  # EvalError, DataError, ...: TorchdeckError
    from ..engine.fmt import epoch_at

    where = f" ({epoch_at(res['epoch'], res.get('batches_done', 0))}, step {res['step']})" if "step" in res else ""
    print(f"checkpoint {ckpt}{where}")
    print(f"  dataset {res.get('dataset')}: {res.get('samples')} samples, " + ", ".join(eval_metrics(res)))
    return EXIT_OK


def eval_metrics(res: dict) -> list[str]:
    """What engine.evaluate found, in words: the loss, the accuracy where the task is
    classification, then the task's own metrics (perplexity, a loss callable's)."""
    from ..engine import fmt
    from ..engine.runs import metric

    out = [] if fmt.real(res.get("loss")) is None else [f"loss {res['loss']:.4f}"]
    if fmt.real(res.get("accuracy")) is not None:
        out.append(f"accuracy {100 * res['accuracy']:.2f}%")
    extra = dict(res.get("metrics") or {}) if isinstance(res.get("metrics"), dict) else {}
    extra.update({k: v for k, v in res.items() if k not in _EVAL_FACTS and k not in extra})
    for name, v in extra.items():
        if fmt.real(v) is not None:
            out.append(f"{metric.label(name)} {metric.show(name, fmt.real(v))}")
    return out or ["no metrics"]


_EVAL_FACTS = ("loss", "accuracy", "samples", "metrics", "dataset", "step", "epoch", "batches_done")


def cmd_env(args) -> int:
    from ..engine.hardware import env_report

    print("\n".join(env_report()))
    return EXIT_OK


def cmd_export(args) -> int:
    from ..engine import config as cfgmod
    from ..engine import export
    from ..engine.hardware import Hardware
    from ..engine.presets import resolve

    # The job runs on other hosts (a cluster's login node often has no GPU at all): validate
    # everything but this host's GPUs and MPI build.
    cfg = _config_or_usage(args, hw=Hardware(gpu_count=None, mpi_available=None))
    if cfg.accelerator == "cuda" and isinstance(cfg.devices, str):
        raise UsageError(f"devices: {cfg.devices}: an exported job cannot know how many GPUs its nodes have; list "
                         "them, e.g. --set 'devices=[0,1,2,3]'")
    from ..engine.kinds import kind_of

    if kind_of(cfg).is_script:  # the user's own script: the torchrun line they would type
        if args.deepspeed:
            raise UsageError("--deepspeed: a script run is exported as --torchrun or --sbatch")
        import shlex

        given = Path(args.preset).expanduser()  # the export cds to the script's folder: a file's path is absolute
        preset = str(given.resolve()) if given.is_file() else str(args.preset)
        again = shlex.join(["torchdeck", "run", preset] + [x for o in _overrides(args) for x in ("--set", o)])
        if args.sbatch:  # the one batch script of every run (engine/slurm/script.py), in the script's folder
            from ..engine.preflight import script_cwd

            cfg.script.cwd = str(script_cwd(cfg).resolve())
            print(export.sbatch(cfg), end="")
            return EXIT_OK
        print(export.script_torchrun(cfg, again), end="")
        return EXIT_OK
    if args.sbatch:
        print(export.sbatch(cfg), end="")
        return EXIT_OK
    if args.write_config:
        config_path = Path(args.write_config).expanduser().resolve()
        try:
            cfgmod.save(cfg, config_path)
        except OSError as exc:
            raise UsageError(f"--write-config: cannot write {config_path}: {exc.strerror or exc}") from None
    elif args.set or args.node_rank is not None:
        raise UsageError("--torchrun with --set: add --write-config FILE so every node reads the same, "
                         "overridden config")
    else:
        config_path = resolve(args.preset).resolve()
    print((export.deepspeed if args.deepspeed else export.torchrun)(cfg, str(config_path), args.run_root), end="")
    return EXIT_OK


def cmd_app(args) -> int:
    from ..engine.presets import DEFAULT_PRESET, resolve

    preset = getattr(args, "preset", None)
    path = resolve(preset or DEFAULT_PRESET)
    if preset:
        # A preset the form cannot open is refused here, as `torchdeck run` refuses it: one line,
        # exit 2, nothing opens. Read the way the Configure screen reads it (its JSON copy when
        # unchanged), so the screen's own read costs nothing more. Bare `torchdeck` opens the
        # shipped default: no read before its first frame.
        from ..engine import preflight

        preflight.load(path, cache=True)
    try:
        from ..app.main import run as run_app
    except ImportError as exc:
        raise UsageError(f"the terminal app cannot start: {exc}; headless commands: torchdeck --help") from None
    if run_app(preset_path=str(path)):  # the app crashed: Textual printed the traceback above
        _err("torchdeck app: the app stopped on an error (the traceback is above)")
        return EXIT_FAILED
    return EXIT_OK


# ----------------------------------------------------------------------------- parser


def _strategies_help() -> str:
    """`compare --strategies`' help, as the strategies list themselves (the Compare dialog's ticks first)."""
    from ..engine.strategies import get_strategy, loop_names

    ticked = [n for n in loop_names() if get_strategy(n).compared_by_default]
    rest = [n for n in loop_names() if n not in ticked]
    return f"comma-separated, e.g. {','.join(ticked)}" + (f" (also {', '.join(rest)})" if rest else "")


def build_parser() -> argparse.ArgumentParser:
    import argparse

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
    s.add_argument("--max-restarts", type=int, metavar="N", help="after a failure, restart from the newest "
                                                                  "checkpoint up to N times (train.max_restarts)")
    s.set_defaults(func=cmd_run)

    s.add_argument("--resume", metavar="RUN", help="continue from RUN's newest checkpoint ('latest': the "
                                                   "newest earlier run of this config's name)")
    from . import slurm

    slurm.add_flags(s)

    # torchdeck launch parses its own command line (torchrun's flags, then the script's arguments
    # unchanged): engine.launch.args; here everything after `launch` is passed through as is
    s = sub.add_parser("launch", add_help=False, prefix_chars="\x00",
                       help="run your own script as torchrun does, and watch it (torchdeck launch --help)")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_launch, node_rank=None)

    s = sub.add_parser("resume", parents=[common, runs_dir, overrides],
                       help="continue a stopped or failed run from its newest checkpoint")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.add_argument("--detach", action="store_true", help="start it and return; watch later with attach")
    s.set_defaults(func=cmd_resume, node_rank=None)

    s = sub.add_parser("attach", parents=[common, runs_dir], help="watch a run (history, then live)")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("runs", parents=[common, runs_dir], help="list runs with their status")
    s.set_defaults(func=cmd_runs)

    s = sub.add_parser("compare", parents=[common, runs_dir, overrides],
                       help="run one job under several strategies, one after another, and compare them")
    s.add_argument("preset", help="preset name or YAML file: the job every strategy runs")
    s.add_argument("--strategies", required=True, metavar="LIST", help=_strategies_help())
    g = s.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, metavar="N", help="optimizer steps per strategy")
    g.add_argument("--epochs", type=int, metavar="N", help="epochs per strategy")
    t = s.add_mutually_exclusive_group()
    t.add_argument("--target", metavar="METRIC<=X",
                   help="time each strategy to this validation metric: val_acc>=0.9, val_loss<=1.6, perplexity<=5")
    t.add_argument("--target-acc", type=float, metavar="X", help="the same as --target val_acc>=X (0-1)")
    s.add_argument("--save-best", metavar="NAME",
                   help="save the fastest strategy that reached the target as user preset NAME")
    s.set_defaults(func=cmd_compare, node_rank=None)

    s = sub.add_parser("tune", parents=[common, runs_dir, overrides],
                       help="find the largest batch that fits on the GPUs (short trial runs)")
    s.add_argument("preset", help="preset name or YAML file (accelerator cuda)")
    s.add_argument("--batch-size", action="store_true", help="grow the batch until a rank runs out of memory, "
                                                             "then search back (every rank must fit)")
    s.add_argument("--steps", type=int, default=3, metavar="N", help="optimizer steps per trial (default 3)")
    s.add_argument("--max-batch", type=int, default=1 << 16, metavar="N", help="largest batch per process to try")
    s.add_argument("--max-trials", type=int, default=12, metavar="N", help="trial runs at most (default 12)")
    s.add_argument("--save", metavar="NAME", help="save the preset with the batch found as user preset NAME")
    s.set_defaults(func=cmd_tune, node_rank=None)

    s = sub.add_parser("stop", parents=[common, runs_dir], help="stop a run gracefully (checkpoint first)")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.add_argument("--kill", action="store_true", help="SIGKILL every process of the run instead")
    s.add_argument("--wait", type=float, metavar="SECONDS", nargs="?", const=60.0,
                   help="wait for the run to end (default 60 s)")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("stacks", parents=[common, runs_dir],
                       help="where each rank of a run is now (Python stacks, grouped)")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.add_argument("--depth", type=int, default=12, metavar="N", help="frames shown per place (default 12)")
    s.set_defaults(func=cmd_stacks)

    s = sub.add_parser("presets", parents=[common], help="list shipped and user presets")
    s.set_defaults(func=cmd_presets)

    s = sub.add_parser("validate", parents=[common, overrides],
                       help="check a preset and show world size, global batch, devices")
    s.add_argument("preset")
    s.add_argument("--memory", action="store_true",
                   help="estimate memory per rank (parameters, gradients, optimizer state, measured activations)")
    s.add_argument("--explain", action="store_true",
                   help="list every value that is not a default and where it came from (preset, --set, host, environment)")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("eval", parents=[common, runs_dir], help="loss and metrics of a checkpoint on its validation set (accuracy for classification)")
    s.add_argument("checkpoint", help="a ckpt-*.pt file, or a run (directory, name, 'latest'): its newest checkpoint")
    s.add_argument("--data-root", metavar="DIR", help="where the data set lives, if not where it was trained")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("metrics", parents=[common, runs_dir],
                       help="write a run's step and epoch metrics as CSV or TensorBoard files")
    s.add_argument("run", help="run directory, its name under the runs dir, or 'latest'")
    s.add_argument("--csv", metavar="FILE", help="one row per step event and per epoch, flat columns; - for stdout")
    s.add_argument("--tensorboard", metavar="DIR", help="TensorBoard event files (needs the tensorboard package)")
    s.set_defaults(func=cmd_metrics)

    s = sub.add_parser("env", parents=[common], help="paste-able report of versions, GPUs, backends")
    s.set_defaults(func=cmd_env)

    s = sub.add_parser("export", parents=[common, overrides], help="print a torchrun command or sbatch script")
    s.add_argument("preset")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--torchrun", action="store_true", help="torchrun command line per node")
    g.add_argument("--sbatch", action="store_true", help="SLURM sbatch script (one torchdeck supervisor per node)")
    g.add_argument("--deepspeed", action="store_true", help="DeepSpeed's launcher: a hostfile and a command per node")
    s.add_argument("--write-config", metavar="FILE", help="save the resolved config here and point torchrun at it")
    s.add_argument("--run-root", metavar="DIR",
                   help="where each node's run directory goes (default $TORCHDECK_RUNS, else ./runs)")
    s.add_argument("--node-rank", type=int, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from ..engine.usercode import forget_inherited  # stdlib only

    forget_inherited()
    if not argv:
        # Bare `torchdeck`, the way most runs start: the app, without importing argparse and
        # building every command's parser first (~6 ms, 3 % of the app's first frame).
        from types import SimpleNamespace

        return _dispatch(cmd_app, SimpleNamespace(command=None, preset=None))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    return _dispatch(getattr(args, "func", cmd_app), args)


def _dispatch(func, args) -> int:
    try:
        rc = func(args)
        sys.stdout.flush()  # a closed pipe shows here, not as 'Exception ignored' at exit
        return rc
    except BrokenPipeError:
        _stdout_to_devnull()  # nothing more to say, and nothing left to flush at exit
        return EXIT_PIPE
    except TorchdeckError as exc:  # a problem the user can fix: one line each, exit 2
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


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        pass


if __name__ == "__main__":
    sys.exit(main())
