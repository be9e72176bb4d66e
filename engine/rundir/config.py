"""The run directory's config.yaml: one config through the launch (issue 36 item 6).

A config is validated once, where it is made, by every rule (engine.preflight: `torchdeck run`,
`resume`, `compare`, `tune`, `launch` and the app's form) and written to the run directory
resolved (RunDir.create). From there it only travels: the supervisor reads it back with
load_validated (the schema's types and canonical forms, none of the rules again) and hands each
of its ranks that same RunConfig (spawn pickles it). What may differ on the host that runs it is
checked there, and only that: the port (moved off a taken one, or refused: the supervisor's plan),
`devices: all` and `free:N` (made this host's GPUs by the supervisor), and at each rank its own
device and network interface (engine.worker.for_host)."""
from __future__ import annotations

import os

from .. import config as cfgmod


def load_validated(path: str | os.PathLike) -> "cfgmod.RunConfig":
    """A config.yaml written from a config validated where it was made, read back as a RunConfig
    without re-running the rules. ConfigError only for a file that is no config at all any more
    (unreadable, not YAML, a wrong type or schema version: edited by hand)."""
    cfg, problems = cfgmod.build(cfgmod.read(path), source=str(path))
    if problems:
        raise cfgmod.ConfigError(problems, str(path))
    return cfg
