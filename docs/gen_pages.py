"""The docs pages made from the code, so they cannot drift from it: the run config reference (from
engine/config.py: every field, its default, its comment, and the rule validate() applies), the
strategy table (from the strategy registry, engine/strategies) and the shipped presets' table.

docs/hooks.py puts them into the site at build time; `python docs/gen_pages.py config|strategies|presets`
prints one (tests/test_docs.py runs it on an edited copy of the schema).
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys

# ----------------------------------------------------------------------------- the run config

_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s?(.*))?$")


def _comments(cls) -> dict[str, str]:
    """Each field's comment in the class source: the one on its line, plus a comment block between
    it and the next field (a block goes to the next field instead when that one has none)."""
    out: dict[str, str] = {}
    last, block = None, []
    for line in inspect.getsource(cls).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("# ").rstrip())
            continue
        m = _FIELD.match(line)
        if not m or m.group(1) not in {f.name for f in dataclasses.fields(cls)}:
            continue
        name, own = m.group(1), (m.group(2) or "").strip()
        if block and (own or last is None):
            if last is not None:
                out[last] = " ".join([out.get(last, "")] + block).strip()
            else:
                own = " ".join(block + [own]).strip()
        elif block:
            own = " ".join(block).strip()
        out[name] = own
        last, block = name, []
    return out


def _default(f) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def _said(value) -> str:
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value!r}`".replace("'", '"')


# Values that break a field's rule: validate() says the rule. Under which config a rule applies:
# the gpt sizes with model gpt, the script section with strategy script.
_PROBES = {int: (-2, -1, 0, 1), float: (-1.0, 0.0, 1.5), str: ("zzz", ""), bool: (True,)}
_BASES = {"model.n_": {"model": {"name": "gpt"}, "data": {"dataset": "text"}},
          "model.block_size": {"model": {"name": "gpt"}, "data": {"dataset": "text"}},
          "script.": {"strategy": "script", "script": {"path": "train.py"}}}


def _base(cfgmod, path: str):
    for prefix, data in _BASES.items():
        if path.startswith(prefix):
            return cfgmod.from_dict(data)
    return cfgmod.RunConfig()


def _rules(cfgmod, path: str, tp) -> list[str]:
    """What validate() says of the field when it is given values that break its rule, without the
    value itself (`must be at least 1, got 0` -> `must be at least 1`)."""
    said = []
    for value in _PROBES.get(tp, ()):
        cfg = _base(cfgmod, path)
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
        for field, why in cfgmod.validate(cfg):
            if field != path:
                continue
            why = re.sub(r"([,;] got .*|; did you mean.*|; '[^']*' .*)$", "", why)
            if why not in said:
                said.append(why)
    return said


def _rows(cfgmod, cls, prefix: str = ""):
    hints = inspect.get_annotations(cls, eval_str=True) if hasattr(inspect, "get_annotations") else {}
    notes = _comments(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        default = _default(f)
        if dataclasses.is_dataclass(default):
            yield ("section", path, type(default))
            yield from _rows(cfgmod, type(default), path + ".")
            continue
        tp = hints.get(f.name, type(default))
        yield ("field", path, default, tp, notes.get(f.name, ""), _rules(cfgmod, path, tp))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_page(cfgmod) -> str:
    """The reference of every field of cfgmod.RunConfig (cfgmod: the engine.config module)."""
    out = ["| field | default | what | rule |", "|---|---|---|---|"]
    sections = []
    for row in _rows(cfgmod, cfgmod.RunConfig):
        if row[0] == "section":
            _, path, cls = row
            doc = (cls.__doc__ or "").strip()
            if doc.startswith(cls.__name__ + "("):  # dataclass' made-up signature: no docstring
                doc = ""
            sections.append((path, doc, ["| field | default | what | rule |", "|---|---|---|---|"]))
            continue
        _, path, default, tp, note, rules = row
        line = f"| `{path}` | {_cell(_said(default))} | {_cell(note)} | {_cell('; '.join(rules))} |"
        (sections[-1][2] if sections and path.startswith(sections[-1][0] + ".") else out).append(line)
    text = ["Top-level fields:", ""] + out
    for path, doc, table in sections:
        text += ["", f"## `{path}`", ""] + ([doc, ""] if doc else []) + table
    return "\n".join(text) + "\n"


# ----------------------------------------------------------------------------- strategies

# Configurations each strategy is asked about (its check(), as validate and the form ask it): what
# it refuses among them is its "refuses" column. Add a scenario here as strategies learn new rules.
_SCENARIOS = {
    "accelerator cpu": {"accelerator": "cpu", "devices": 2},
    "one process": {"devices": 1},
    "several nodes": {"nodes": {"num_nodes": 2, "master_addr": "10.0.0.1"}},
    "torch.compile": {"train": {"compile": True}},
    "the gpt language model": {"model": {"name": "gpt"}, "data": {"dataset": "text"}},
}


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def strategy_facts(name: str) -> dict:
    """What the registry says of one strategy; the one place to read a new self-description from."""
    from torchdeck.engine import config as cfgmod
    from torchdeck.engine.hardware import Hardware
    from torchdeck.engine.strategies import get_strategy

    s = get_strategy(name)
    module = sys.modules[type(s).__module__]
    refuses: dict[str, list[str]] = {}  # what it says -> the scenarios it said it in
    hw = Hardware(gpu_count=2, mpi_available=False)

    def cfg_with(n: int, data: dict):
        cfg, _ = cfgmod.build({"accelerator": "cuda" if s.needs_cuda else "cpu",
                               "devices": list(range(n)) if s.needs_cuda else n, **data, "strategy": name,
                               **({"script": {"path": "train.py"}} if name == "script" else {})})
        return cfg

    # its own setting: the fewer devices (1 or 2) it takes as it is; each scenario changes that
    natural = next((n for n in (1, 2) if not s.check(cfg_with(n, {}), hw)), 2)
    for where, data in _SCENARIOS.items():
        cfg = cfg_with(natural, data)
        try:
            problems = s.check(cfg, hw)
        except Exception as exc:  # noqa: BLE001 - a strategy that cannot be asked says so on the page
            problems = [("", f"(could not ask: {type(exc).__name__})")]
        for _field, why in problems:
            refuses.setdefault(why, []).append(where)
    describe = getattr(s, "describe", None)
    return {"name": name, "summary": getattr(s, "summary", ""),
            "about": describe() if callable(describe) else _first_paragraph(module.__doc__),
            "needs_cuda": getattr(s, "needs_cuda", False), "distributed": getattr(s, "distributed", False),
            "devices": s.cpu_devices_hint(), "refuses": refuses,
            # newer self-descriptions, read where the strategy has them
            "section": getattr(s, "section", ""), "batch": getattr(s, "batch_hint", "per process")}


def strategies_page() -> str:
    from torchdeck.engine.strategies import names

    out = ["| strategy | what | GPUs | process group | `devices` on the CPU | `train.batch_size` | its section |",
           "|---|---|---|---|---|---|---|"]
    details = []
    for name in names():
        f = strategy_facts(name)
        out.append(f"| [`{name}`](#{name}) | {_cell(f['summary'])} | {'needs them' if f['needs_cuda'] else 'optional'}"
                   f" | {'yes' if f['distributed'] else 'no'} | {'-' if f['needs_cuda'] else _cell(f['devices'])} | {_cell(f['batch'])}"
                   f" | {'`' + f['section'] + ':`' if f['section'] else '-'} |")
        details += ["", f"## `{name}`", "", f["about"] or f["summary"], ""]
        if f["refuses"]:
            details += ["Refuses:", ""] + [f"- {_cell(why)} (asked with {', '.join(where)})"
                                           for why, where in f["refuses"].items()]
        else:
            details += ["Refuses none of the cases asked (" + ", ".join(_SCENARIOS) + ")."]
    return "\n".join(out + details) + "\n"


# ----------------------------------------------------------------------------- presets

def presets_page(folder=None) -> str:
    """The shipped presets (presets/*.yaml): name, strategy and their own description."""
    import yaml
    from pathlib import Path

    folder = Path(folder or Path(__file__).resolve().parent.parent / "presets")
    out = ["| preset | strategy | what |", "|---|---|---|"]
    for path in sorted(folder.glob("*.yaml"), key=lambda p: (p.stem != "quickstart", p.stem)):
        data = yaml.safe_load(path.read_text()) or {}
        name = f"`{path.stem}`" + (" (default)" if path.stem == "quickstart" else "")
        out.append(f"| {name} | {data.get('strategy', 'cpu')} | {_cell(str(data.get('description', '')))} |")
    return "\n".join(out) + "\n"


PAGES = {"presets": presets_page,
         "config": lambda: config_page(__import__("torchdeck.engine.config", fromlist=["x"])),
         "strategies": strategies_page}

if __name__ == "__main__":
    print(PAGES[sys.argv[1]](), end="")
