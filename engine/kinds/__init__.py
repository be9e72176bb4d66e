"""What a run is, as its front ends need to know it: torchdeck's own loop (loop.py), or the
user's script (script.py, `torchdeck launch`). One object per kind answers what applies to such a
run (checkpoint, resume, eval, a memory estimate, how a stop ends it) and, where it does not, why,
so the CLI, the Monitor and the Runs list say the same thing instead of each testing
`== "script"` and writing its own words. A kind is one module of this package defining `KIND`:
adding one is adding a file. Torch-free and UI-free (imported by app/ and cli/ on the first frame).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str  # "loop", "script": the run_start event's run_kind ("" for the loop, as older runs wrote it)
    title: str  # the words a line uses for it
    # the strategies whose runs are of this kind; () with default=True: every strategy no other kind claims
    strategies: tuple = ()
    default: bool = False
    # why an action does not apply ("" = it does); one clause, no full stop, to follow "a script run: "
    no_checkpoint: str = ""
    no_resume: str = ""
    no_eval: str = ""
    no_memory_estimate: str = ""
    # torchdeck's loop sections (model, data, train, optimizer, checkpoint) configure it: its length,
    # global batch and data are torchdeck's to know; False: the script's own, unknown to torchdeck
    loop_config: bool = True
    # its ranks are the user's program run by engine/launch (the shim, in script.cwd, SIGTERM on a
    # stop), not torchdeck's spawned loop
    ranks_from_shim: bool = False
    # the front ends print what its ranks print (as torchrun does) and exit with the failing rank's
    # code (torchrun's rule) rather than torchdeck's status codes
    shows_rank_output: bool = False
    exits_as_torchrun: bool = False
    # the start-up breakdown's name for the time before the first phase a rank reports
    first_phase: str = "torch import"
    # what a starting run's header says before any rank reports a phase
    starting: str = "ranks importing torch"

    @property
    def is_script(self) -> bool:
        """Its ranks are the user's own program (the views show what torchdeck.log and the exit
        codes tell, not the loop's numbers)."""
        return self.ranks_from_shim

    @property
    def can_checkpoint(self) -> bool:
        return not self.no_checkpoint

    @property
    def can_resume(self) -> bool:
        return not self.no_resume

    @property
    def can_eval(self) -> bool:
        return not self.no_eval

    @property
    def can_estimate_memory(self) -> bool:
        return not self.no_memory_estimate

    def stop_wording(self, grace_s: float | None = None) -> str:
        """How a stop ends such a run, for `torchdeck stop`, Ctrl-C, the Monitor's stop dialog and
        its toast (grace_s: the run's script.stop_grace_s, when known)."""
        if self.ranks_from_shim:
            after = f"{grace_s:g} s" if grace_s is not None else "script.stop_grace_s"
            return f"ranks get SIGTERM, then SIGKILL after {after}"
        return "ranks finish this step, rank 0 checkpoints"

    def does_not_apply(self, command: str, why: str, name: str = "") -> str:
        """The one line a command that does not apply answers with (name: the run's)."""
        return f"{command} does not apply to a {self.title}{f' ({name})' if name else ''}: {why}"




def kinds() -> list[Kind]:
    """Every kind, from this package's modules (each defines KIND), the default one last."""
    global _KINDS
    if _KINDS is None:
        found = [importlib.import_module(f"{__name__}.{m.name}").KIND
                 for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
        _KINDS = sorted(found, key=lambda k: (k.default, k.name))
    return _KINDS


_KINDS: list[Kind] | None = None


def _by_name(name: str) -> Kind:
    for k in kinds():
        if name and (name == k.name or name in k.strategies):
            return k
    return next(k for k in kinds() if k.default)


def kind_of(x) -> Kind:
    """The kind of a config (its strategy), a strategy name, a run_kind ("script" or ""), or anything
    with a `run_kind` (a RunView, the Monitor's state) or a `strategy` attribute."""
    if isinstance(x, Kind):
        return x
    if x is not None and not isinstance(x, str):
        value = getattr(x, "run_kind", None)
        if value is None:
            value = getattr(x, "strategy", None)
        x = value
    return _by_name(x or "")


def kind_of_run(run) -> Kind:
    """The kind of a run directory, from its recorded config (a run that never wrote one: the loop)."""
    try:
        return kind_of(run.config())
    except Exception:  # a run dir missing or holding a broken config.yaml is someone else's to report
        return _by_name("")


def stop_grace_of(run) -> float | None:
    """A script run's script.stop_grace_s as recorded, or None."""
    try:
        return float(run.config().script.stop_grace_s)
    except Exception:
        return None
