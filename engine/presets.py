"""Shipped and user presets: find them, describe them, save and delete the user's own.

Shipped presets live in the package's `presets/` folder and are never written to; a user's
presets go to `user_presets_dir()` (XDG config dir), so an upgrade never clobbers
them and saving never clobbers ours. A plain name resolves to the shipped preset first (so
`torchdeck run quickstart` means the same everywhere); `user:NAME` or `shipped:NAME` picks one.
No torch here: the app lists presets on its first frame.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import config as cfgmod
from .config import ConfigError

DEFAULT_PRESET = "quickstart"


def user_presets_dir() -> Path:
    """User presets live apart from the shipped ones, so saving never overwrites those."""
    base = os.environ.get("TORCHDECK_PRESETS") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "torchdeck", "presets")
    return Path(base)


def shipped_presets_dir() -> Path:
    """The presets/ folder beside the engine package: in a checkout, and in site-packages when
    installed from the wheel (it ships as package data)."""
    return Path(__file__).resolve().parent.parent / "presets"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PresetExists(ConfigError):
    """Saving would replace an existing user preset; ask, then pass overwrite=True."""


@dataclass
class PresetInfo:
    name: str
    path: Path
    source: str  # "shipped" | "user"
    description: str
    strategy: str


def _describe(path: Path, source: str) -> PresetInfo:
    """Read just enough of a preset to list it; a broken one is listed, not hidden."""
    import yaml  # not at import: the app's first frame reads no preset list

    try:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a mapping")
        desc = str(data.get("description") or "")
        strategy = str(data.get("strategy") or "cpu")
    except (OSError, ValueError, yaml.YAMLError):
        desc, strategy = "(unreadable: `torchdeck validate` says why)", "?"
    return PresetInfo(path.stem, path, source, desc, strategy)


def _yaml_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    except OSError:
        return []


def list_presets() -> list[PresetInfo]:
    """Shipped ones first (the default at the top), then the user's; both kept when names clash."""
    shipped = [_describe(p, "shipped") for p in _yaml_files(shipped_presets_dir())]
    shipped.sort(key=lambda i: (i.name != DEFAULT_PRESET, i.name))
    user = [_describe(p, "user") for p in _yaml_files(user_presets_dir())]
    return shipped + user


def _find(name: str, source: str) -> Path | None:
    folder = shipped_presets_dir() if source == "shipped" else user_presets_dir()
    for ext in (".yaml", ".yml"):
        p = folder / f"{name}{ext}"
        if p.is_file():
            return p
    return None


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A preset file for a path, a name, or `user:NAME` / `shipped:NAME`; ConfigError if none."""
    text = str(name_or_path)
    as_path = Path(text).expanduser()
    if as_path.is_file():
        return as_path
    source, _, bare = text.partition(":") if text.startswith(("user:", "shipped:")) else ("", "", text)
    if _NAME.match(bare) and not bare.endswith((".yaml", ".yml")):
        for src in ([source] if source else ["shipped", "user"]):
            found = _find(bare, src)
            if found:
                return found
    names = sorted({i.name for i in list_presets()})
    looks_like_path = os.sep in text or text.endswith((".yaml", ".yml"))
    why = "no such preset file" if looks_like_path else "no preset of that name"
    guess = difflib.get_close_matches(bare, names, n=1)
    if guess and not looks_like_path:
        why += f" (did you mean {guess[0]!r}?)"
    raise ConfigError([("", f"{why}; known presets: {', '.join(names) or '(none)'}")], text)


def check_name(name: str) -> None:
    if not _NAME.match(name or ""):
        raise ConfigError([("name", f"a preset name uses letters, digits, '.', '_' and '-' "
                                    f"and starts with a letter or digit; got {name!r}")])
    if _find(name, "shipped"):
        raise ConfigError([("name", f"{name!r} is a shipped preset; save under another name")])


def user_preset_path(name: str) -> Path:
    return user_presets_dir() / f"{name}.yaml"


def save_user_preset(cfg: "cfgmod.RunConfig", name: str, overwrite: bool = False) -> Path:
    """Write cfg as the user preset `name` (its `name` field set to match)."""
    check_name(name)
    path = user_preset_path(name)
    if path.exists() and not overwrite:
        raise PresetExists([("name", f"user preset {name!r} exists; overwrite it to replace")], str(path))
    out = cfg.copy()
    out.name = name
    cfgmod.save(out, path, changes_only=True)  # what differs from the defaults, as a person writes it
    return path


def delete_user_preset(name: str) -> None:
    if _find(name, "shipped") and not _find(name, "user"):
        raise ConfigError([("name", f"{name!r} is a shipped preset; shipped presets cannot be deleted")])
    path = _find(name, "user")
    if path is None:
        raise ConfigError([("name", f"no user preset named {name!r}")])
    path.unlink()
