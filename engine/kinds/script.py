"""The user's own script (strategy script, `torchdeck launch`): its ranks are the user's program
started as torchrun starts it, so what torchdeck cannot see (its model, its checkpoints, its
batch) does not apply, each with the reason the front ends give."""
from . import Kind

KIND = Kind(
    "script", "script run", strategies=("script",),
    no_checkpoint="the script saves its own checkpoints, torchdeck does not know their format",
    no_resume="torchdeck holds no checkpoint of it; resume inside your script and launch it again",
    no_eval="torchdeck holds neither its model nor a checkpoint of it; evaluate in your script",
    no_memory_estimate="the model and batch are your script's, torchdeck cannot see them before it runs",
    loop_config=False, ranks_from_shim=True, shows_rank_output=True, exits_as_torchrun=True,
    first_phase="python, imports",  # a script's: up to its rendezvous
    starting="ranks starting python",
)
