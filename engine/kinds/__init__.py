"""What a run is, as its front ends need to know it: torchdeck's own loop, or the user's script
(strategy script, `torchdeck launch`). One object per kind answers what applies to such a run
(checkpoint, resume, eval, a memory estimate, how a stop ends it) and, where it does not, why,
so the CLI, the Monitor and the Runs list say the same thing instead of each testing
`== "script"` and writing its own words. Torch-free and UI-free (imported by app/ and cli/).
"""
from __future__ import annotations

from dataclasses import dataclass

SCRIPT = "script"  # the strategy (config) and the run_kind (run_start event) of a user's script


@dataclass(frozen=True)
class Kind:
    name: str  # "loop" or "script"
    title: str  # the words a line uses for it
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

    @property
    def is_script(self) -> bool:
        return self.name == SCRIPT

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
        if self.is_script:
            after = f"{grace_s:g} s" if grace_s is not None else "script.stop_grace_s"
            return f"ranks get SIGTERM, then SIGKILL after {after}"
        return "ranks finish this step, rank 0 checkpoints"

    def does_not_apply(self, command: str, why: str, name: str = "") -> str:
        """The one line a command that does not apply answers with (name: the run's)."""
        return f"{command} does not apply to a {self.title}{f' ({name})' if name else ''}: {why}"


LOOP = Kind("loop", "torchdeck run")
SCRIPT_KIND = Kind(
    SCRIPT, "script run",
    no_checkpoint="the script saves its own checkpoints, torchdeck does not know their format",
    no_resume="torchdeck holds no checkpoint of it; resume inside your script and launch it again",
    no_eval="torchdeck holds neither its model nor a checkpoint of it; evaluate in your script",
    no_memory_estimate="the model and batch are your script's, torchdeck cannot see them before it runs",
    loop_config=False, ranks_from_shim=True, shows_rank_output=True, exits_as_torchrun=True,
    first_phase="python, imports",  # a script's: up to its rendezvous
)
# the names the brief and callers use
loop, script = LOOP, SCRIPT_KIND


def kind_of(x) -> Kind:
    """The kind of a config (its strategy), a strategy name, a run_kind ("script" or ""), or anything
    with a `run_kind` (a RunView, the Monitor's state) or a `strategy` attribute."""
    if isinstance(x, Kind):
        return x
    if x is None:
        return LOOP
    if not isinstance(x, str):
        value = getattr(x, "run_kind", None)
        if value is None:
            value = getattr(x, "strategy", None)
        x = value or ""
    return SCRIPT_KIND if x == SCRIPT else LOOP


def kind_of_run(run) -> Kind:
    """The kind of a run directory, from its recorded config (a run that never wrote one: the loop)."""
    try:
        return kind_of(run.config())
    except Exception:  # a run dir missing or holding a broken config.yaml is someone else's to report
        return LOOP


def stop_grace_of(run) -> float | None:
    """A script run's script.stop_grace_s as recorded, or None."""
    try:
        return float(run.config().script.stop_grace_s)
    except Exception:
        return None
