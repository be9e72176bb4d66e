"""The run directory: everything one run leaves behind, and how the app finds runs.

    runs/<YYYYmmdd-HHMMSS>-<name>/
        config.yaml        the resolved config the run was started with
        events.jsonl       one event per line (engine.events)
        supervisor.pid     pid of the supervisor while it lives (its process group = its pid)
        supervisor.log     the supervisor's own output
        rank<N>.log        stdout/stderr of global rank N
        status.json        final status, written last: {"status", "exit_codes", "root_cause", ...}
        stop               present: a graceful stop was asked (the supervisor also takes SIGTERM)
        checkpoints/       ckpt-<step>.pt, newest complete one is the resume point

No torch here: the app lists and opens runs on its first frame.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from engine import config as cfgmod


def runs_root() -> Path:
    """Where runs go: $TORCHDECK_RUNS, else ./runs under the current directory."""
    return Path(os.environ.get("TORCHDECK_RUNS", "runs")).resolve()


def user_presets_dir() -> Path:
    """User presets live apart from the shipped ones, so saving never overwrites those."""
    base = os.environ.get("TORCHDECK_PRESETS") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "torchdeck", "presets")
    return Path(base)


def shipped_presets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "presets"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, cfg: "cfgmod.RunConfig", root: Path | None = None) -> "RunDir":
        root = Path(root) if root else runs_root()
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"{stamp}-{_slug(cfg.name)}"
        path = root / base
        n = 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = root / f"{base}-{n}"
        rd = cls(path)
        cfgmod.save(cfg, rd.config_path)
        return rd

    # ---------------------------------------------------------------- paths
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def status_path(self) -> Path:
        return self.path / "status.json"

    @property
    def pid_path(self) -> Path:
        return self.path / "supervisor.pid"

    @property
    def launcher_pid_path(self) -> Path:
        """torchrun's agent, for a run dir written under torchrun (there is no supervisor then)."""
        return self.path / "launcher.pid"

    @property
    def stop_path(self) -> Path:
        return self.path / "stop"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def rank_log(self, rank: int) -> Path:
        return self.path / f"rank{rank}.log"

    # ---------------------------------------------------------------- state
    def config(self) -> "cfgmod.RunConfig":
        return cfgmod.load(self.config_path)

    def final_status(self) -> dict | None:
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def write_status(self, status: dict) -> None:
        write_atomic(self.status_path, json.dumps(status, indent=2))

    def supervisor_pid(self) -> int | None:
        return _read_pid(self.pid_path)

    def launcher_pid(self) -> int | None:
        return _read_pid(self.launcher_pid_path)

    def is_live(self) -> bool:
        """True while the supervisor process of this run (or torchrun's agent) exists."""
        if self.final_status() is not None:
            return False
        pid = self.supervisor_pid() or self.launcher_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def status(self) -> str:
        """finished | failed | stopped | running | starting | lost (supervisor gone, no final status)."""
        final = self.final_status()
        if final is not None:
            return final.get("status", "failed")
        if self.is_live():
            return "running"
        if self.supervisor_pid() is None and self.launcher_pid() is None:
            return "starting"
        return "lost"


def write_atomic(path: Path, text: str) -> None:
    """Readers (attach, the app, `torchdeck runs`) never see half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def list_runs(root: Path | None = None) -> list[RunDir]:
    """Newest first."""
    root = Path(root) if root else runs_root()
    if not root.is_dir():
        return []
    dirs = [RunDir(p) for p in root.iterdir() if (p / "config.yaml").is_file()]
    dirs.sort(key=lambda r: r.path.stat().st_mtime, reverse=True)
    return dirs
