"""The layers hold: engine/ imports neither app/, cli/ nor textual; app/ never imports torch when a
module is imported (the first frame must be fast); the run core and preflight are torch-free;
the console script imports neither torch nor textual before a command needs them."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Modules a file imports: at module level only, or anywhere (inside functions too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, (ast.If, ast.Try)) and top_level_only:
            found.update(_imports_in(node))
    return found


def _imports_in(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.add(n.module)
    return out


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


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
        hit |= {m for m in _imports(path, top_level_only=True)
                if m.startswith(("engine.worker", "engine.supervisor", "engine.train", "engine.data",
                                 "engine.models", "engine.checkpoint"))}
        if hit:
            bad[str(path.relative_to(ROOT))] = sorted(hit)
    assert not bad, f"app modules import torch (or engine parts that do) at import: {bad}"


def test_core_modules_load_without_torch_or_textual():
    code = ("import sys\n"
            "import engine.runs.layout, engine.runs.status, engine.runs.view, engine.runs.follow, "
            "engine.runs.catalog, engine.runs.control, engine.runs.fmt, engine.preflight, engine.errors, "
            "engine.events, engine.config, engine.presets, cli.main, cli.progress\n"
            "import cli.main as m; m.build_parser()\n"
            "bad = sorted(x for x in sys.modules if x.split('.')[0] in ('torch', 'textual', 'app'))\n"
            "print('BAD', bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("BAD []"), out.stdout


def test_bare_torchdeck_opens_the_app_without_building_the_parser():
    """`torchdeck` with no arguments (how most sessions start) goes straight to the app: importing
    argparse and building every command's parser cost ~3 % of the app's first frame."""
    code = ("import sys\n"
            "import cli.main as m\n"
            "m.cmd_app = lambda args: print('APP', args.preset, 'argparse' in sys.modules) or 0\n"
            "sys.exit(m.main([]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "APP None False", out.stdout
