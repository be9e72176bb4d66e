"""The layers hold: engine/ imports neither app/, cli/ nor textual; app/ never imports torch when a
module is imported (the first frame must be fast); the run core and preflight are torch-free;
the console script imports neither torch nor textual before a command needs them."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Modules a file imports: at module level only, or anywhere (inside functions too), relative
    imports made absolute and the torchdeck. namespace left off (torchdeck.engine.config ->
    engine.config, the name of engine/config.py in the repository)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = _module_name(path)
    return {name for node in _statements(tree, top_level_only)
            for name in _targets(node, mod, path.name == "__init__.py") if name}


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


# A user's engine.py, app.py, cli.py or presets/ in the working directory (first on sys.path) must
# shadow nothing of ours (issue 29): the code says torchdeck.engine, never engine.
CODE_NAMING_OURS = re.compile(r"(?:^|[\s;(])(?:from|import) (?:engine|app|cli|presets)(?:[\s.,]|$)"
                              r"|-m (?:engine|app|cli)\b")
# a user's script in a test (it reports through torchdeck.log) may import the user's own engine.py
USER_SCRIPT = re.compile(r"(?m)^\s*import torchdeck\s*$")


def _docstrings(tree) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_our_modules_are_named_in_the_torchdeck_namespace_only():
    """Inside engine/, app/ and cli/ imports are relative; elsewhere (tests, bench) they say
    torchdeck.engine...; code in strings (`-c` lines, `-m` module names) too. A top-level `engine` would be whatever the working directory holds."""
    bad = []
    for top in ("engine", "app", "cli", "tests", "bench", "torchdeck"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                      and CODE_NAMING_OURS.search(node.value) and not USER_SCRIPT.search(node.value)):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}: import {n}" for n in names
                        if n.split(".")[0] in OWN]
    assert not bad, "top-level names of ours (say torchdeck.engine...):\n" + "\n".join(bad)


def test_engine_never_imports_app_cli_or_textual():
    bad = {}
    for path in (ROOT / "engine").rglob("*.py"):
        hit = _top(_imports(path, top_level_only=False)) & {"app", "cli", "textual", "rich", "textual_plotext"}
        if hit:
            bad[str(path.relative_to(ROOT))] = sorted(hit)
    assert not bad, f"engine imports the layers above it: {bad}"


def test_app_never_imports_torch_at_module_import():
    bad = {}
    for path in (ROOT / "app").rglob("*.py"):
        hit = _top(_imports(path, top_level_only=True)) & {"torch", "torchvision", "numpy", "cli"}
        if hit:
            bad[str(path.relative_to(ROOT))] = sorted(hit)
    assert not bad, f"app modules import torch at import: {bad}"


# ----------------------------------------------------------------------------- the project's own imports

HEAVY = {"torch", "torchvision", "deepspeed"}  # seconds to import: never on the app's first frame
OWN = ("engine", "app", "cli", "presets")  # the repository's folders: torchdeck.engine, ... at runtime


def _module_name(path: Path) -> str:
    """A file's module by its place in the repository (engine/rundir/layout.py -> engine.rundir.layout;
    at runtime torchdeck.engine.rundir.layout: the tests leave the namespace off)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(*packages: str) -> dict[str, Path]:
    """engine.rundir.layout -> its file, for every module of the packages (a package by its __init__)."""
    return {_module_name(path): path for pkg in packages for path in sorted((ROOT / pkg).rglob("*.py"))}


def _statements(tree: ast.Module, top_level_only: bool):
    """Import statements run when the module is imported (those in top-level if/try blocks
    included), or every import statement, those inside functions too."""
    if not top_level_only:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, (ast.If, ast.Try)):
            out += [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


def _targets(node, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement loads: `from .config import load` in engine/preflight.py
    loads engine.config; `from torchdeck.engine import optim` loads engine.optim (relative imports
    made absolute, the torchdeck. namespace left off, as module names are here)."""
    if isinstance(node, ast.Import):
        return [_bare(a.name) for a in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
    base = _bare(base)
    return [f"{base}.{a.name}" if base else a.name for a in node.names] + [base]


def _bare(name: str) -> str:
    """torchdeck.engine.config -> engine.config (the repository's folders are the namespace's
    packages); any other name as it is."""
    head, _, rest = name.partition(".")
    return rest if head == "torchdeck" and rest.split(".")[0] in OWN else name


def _own(name: str, known) -> str | None:
    """The project module a dotted name is, or lies in (engine.config.load -> engine.config)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _graph(known: dict[str, Path], top_level_only: bool) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: line}, and (key None) the other packages it imports."""
    graph: dict[str, dict] = {}
    for mod, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: dict = {None: set()}
        for node in _statements(tree, top_level_only):
            for name in _targets(node, mod, path.name == "__init__.py"):
                dst = _own(name, known)
                if dst is None:
                    edges[None].add(name.split(".")[0])
                elif dst != mod:
                    edges.setdefault(dst, node.lineno)
        graph[mod] = edges
    return graph


def _loop_through(graph, start: str) -> list[str] | None:
    """A path start -> ... -> start along import edges, or None (depth-first, no recursion)."""
    seen, stack = set(), [(start, [start])]
    while stack:
        mod, path = stack.pop()
        for dst in graph[mod]:
            if dst is None:
                continue
            if dst == start:
                return path + [start]
            if dst not in seen:
                seen.add(dst)
                stack.append((dst, path + [dst]))
    return None


def test_no_import_cycles_counting_imports_inside_functions():
    """A lazy import hides a cycle from Python, not from the reader (issue 28): the schema at the
    bottom, the strategies, the hardware probe and the run directory above it, the rank process on
    top. Any loop among engine, app and cli modules fails, with each step's file and line."""
    known = _modules("engine", "app", "cli")
    graph = _graph(known, top_level_only=False)
    loops = []
    done: set[str] = set()
    for mod in sorted(graph):
        if mod in done:
            continue
        loop = _loop_through(graph, mod)
        if loop:
            done.update(loop)
            loops.append(" -> ".join(f"{a} ({known[a].relative_to(ROOT)}:{graph[a][b]})"
                                     for a, b in zip(loop, loop[1:])) + f" -> {loop[-1]}")
    assert not loops, "import cycles:\n" + "\n".join(loops)


def _heavy_engine_modules(graph) -> dict[str, list[str]]:
    """Engine modules whose import imports torch (itself, or through the engine modules and parent
    packages it imports at module level) -> the chain that does."""
    def parents(mod):
        parts = mod.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in graph]

    heavy = {m: [m, sorted(e[None] & HEAVY)[0]] for m, e in graph.items() if e[None] & HEAVY}
    grew = True
    while grew:
        grew = False
        for mod, edges in graph.items():
            if mod in heavy:
                continue
            via = next((d for d in sorted(d for d in edges if d is not None) + parents(mod) if d in heavy), None)
            if via is not None:
                heavy[mod] = [mod] + heavy[via]
                grew = True
    return heavy


def test_app_imports_no_engine_module_that_imports_torch_at_module_import():
    """Which engine modules import torch is computed, not listed (issue 27: `import engine.optim`
    at the top of app/main.py passed a test that banned six modules by name)."""
    engine = _graph(_modules("engine"), top_level_only=True)
    heavy = _heavy_engine_modules(engine)
    assert "engine.train" in heavy and "engine.config" not in heavy  # the computation itself holds
    known = _modules("app", "engine")
    bad = {}
    for mod, path in _modules("app").items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _statements(tree, top_level_only=True):
            for name in _targets(node, mod, path.name == "__init__.py"):
                dst = _own(name, known)
                if dst in heavy:
                    bad[f"{path.relative_to(ROOT)}:{node.lineno}"] = " -> ".join(heavy[dst])
    assert not bad, f"app modules import torch through engine at import: {bad}"


def test_core_modules_load_without_torch_or_textual():
    code = ("import sys\n"
            "from torchdeck.engine.runs import view, follow, catalog, control\n"
            "from torchdeck.engine.rundir import layout, status, stacks\n"
            "from torchdeck.engine import fmt, kinds\n"
            "from torchdeck.engine import preflight, errors, events, config, presets\n"
            "from torchdeck.cli import main, progress\n"
            "main.build_parser()\n"
            "bad = sorted(x for x in sys.modules if x.split('.')[0] in ('torch', 'textual', 'app', 'engine', 'cli')\n"
            "             or x.startswith('torchdeck.app'))\n"
            "print('BAD', bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("BAD []"), out.stdout


def test_bare_torchdeck_opens_the_app_without_building_the_parser():
    """`torchdeck` with no arguments (how most sessions start) goes straight to the app: importing
    argparse and building every command's parser cost ~3 % of the app's first frame."""
    code = ("import sys\n"
            "import torchdeck.cli.main as m\n"
            "m.cmd_app = lambda args: print('APP', args.preset, 'argparse' in sys.modules) or 0\n"
            "sys.exit(m.main([]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "APP None False", out.stdout


# ----------------------------------------------------------------------------- the run kind, asked

# a test of the run kind by its name, as issue 36 item 2 greps for it (quotes either way, and the
# kind's name on the left too)
KIND_TEST = re.compile(r"""[=!]=\s*(["'])script\1|(["'])script\2\s*(?:[=!]=|(?:not\s+)?in\b)""")
# where the name may be tested: the run kinds themselves, and the script strategy naming itself
KIND_OWNERS = {"engine/kinds/__init__.py", "engine/strategies/script.py"}
KIND_ASKERS = ("engine", "cli", "app")


def test_the_run_kind_is_asked_of_its_object_not_tested_by_name():
    """What a script run is (its config, its ranks, what stop does, what its views show) lives in
    engine/kinds/__init__.py: `kind_of(x).is_script` or one of its properties, never `== "script"` in a
    caller (issue 36 item 2: 27 such tests in 9 files, each writing its own answer)."""
    bad = []
    for top in KIND_ASKERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in KIND_OWNERS:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if KIND_TEST.search(line):
                    bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "the run kind tested by name (ask engine.kinds.kind_of(...) instead):\n" + "\n".join(bad)


# ----------------------------------------------------------------------------- the floors

# Bottom to top; a module may import its own floor and the floors below, never a floor above (issue 36
# item 5). A module is on the floor of the longest prefix listed (engine.runs.view.steps is on
# engine.runs.view's). Imports inside functions count: a lazy import up is still an arrow up.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base: leaf rules, no project imports above them", (
        "engine", "engine.errors", "engine.files", "engine.procs", "engine.events", "engine.network",
        "engine.fmt", "engine.affinity", "engine.nvml", "engine.usercode", "engine.kinds",
        "engine.slurm")),
    ("schema: the run config and presets", ("engine.config", "engine.presets")),
    ("run directory: its layout, status and stacks on disk", ("engine.rundir",)),
    ("parts: what a rank is built from", (
        "engine.strategies", "engine.hardware", "engine.sources", "engine.cache", "engine.text",
        "engine.data", "engine.models", "engine.batch", "engine.losses", "engine.sums", "engine.optim",
        "engine.checkpoint", "engine.nodynamo",
        "engine.launch", "engine.nodes", "engine.metrics")),
    ("checks: a config judged before anything starts", ("engine.preflight", "engine.memory", "engine.export",
                                                        "engine.slurm.script")),
    ("views: a run's events read and reduced", (
        "engine.runs", "engine.runs.view", "engine.runs.fleet", "engine.runs.metric", "engine.runs.follow",
        "engine.runs.progress", "engine.runs.catalog")),
    ("processes: the ranks and their supervisor", ("engine.train", "engine.window", "engine.agreement",
                                                  "engine.evaluate", "engine.worker", "engine.supervisor",
                                                  "engine.slurm.node")),
    ("orchestration: runs started, stopped, compared, tuned", (
        "engine.runs.control", "engine.runs.compare", "engine.runs.tune", "engine.slurm.submit")),
    ("app parts: widgets and sources every screen shares", ("app", "app.widgets", "app.sources", "app.keybar")),
    ("screens", ("app.configure", "app.monitor", "app.runs", "app.compare")),
    ("front ends: the app and the CLI", ("app.main", "cli")),
]


def _floor_of(mod: str) -> int | None:
    best, floor = -1, None
    for n, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best:
                best, floor = len(p), n
    return floor


def test_every_import_goes_down_the_floors():
    """The floors, named: a low room that imports a high one (a lazy import too) is a loop waiting to
    happen and a reason the low room cannot be read alone."""
    known = _modules("engine", "app", "cli")
    graph = _graph(known, top_level_only=False)
    unplaced = sorted(m for m in graph if _floor_of(m) is None)
    assert not unplaced, "modules on no floor (add them to FLOORS in tests/test_layers.py):\n" + "\n".join(unplaced)
    up = []
    for mod, edges in sorted(graph.items()):
        for dst, line in edges.items():
            if dst is not None and _floor_of(dst) > _floor_of(mod):
                up.append(f"{known[mod].relative_to(ROOT)}:{line}: {mod} ({FLOORS[_floor_of(mod)][0].split(':')[0]})"
                          f" imports {dst} ({FLOORS[_floor_of(dst)][0].split(':')[0]})")
    assert not up, "imports up the floors:\n" + "\n".join(up)
