"""Every shell example of README.md and docs/ that starts with `torchdeck` or `python` runs here, on
the CPU, and prints what its page says it prints; or its page says why it is not run here.

A page says so in an HTML comment on the line above the example's code block:
    <!-- docs-test: expect "run finished after" "val accuracy" -->   run it; its output holds each
    <!-- docs-test: not run: needs a GPU -->                          not run here, and why
A block with an example and neither is a failure, as is an example that exits non-zero or does
not print what its comment expects (a renamed flag in the docs turns this red). Examples run in
the order of the README, then of docs/ by file name, in one sandbox, so `latest` and `runs` see
the runs made before them; runs are shortened by the settings in SHORT.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
SHELL = {"bash", "sh", "shell", "console"}  # a plain block counts its `$ ` lines only
MARK = re.compile(r"^\s*<!-- docs-test: (.*) -->\s*$")
# Short settings: the same job, smaller data (the examples' own flags are kept); examples/train.py's
# 3 epochs of 5 steps print what its 20-step epochs print (its 60 gloo steps took ~10 s on a busy machine)
SHORT = [(re.compile(r"^torchdeck (run|compare) quickstart\b"),
          "--set train.epochs=1 --set data.train_size=512 --set data.val_size=128"),
         (re.compile(r"^torchdeck launch .*examples/train\.py\b"), "--steps-per-epoch 5")]


@dataclass
class Block:
    where: str  # page:line
    commands: list[str]
    mark: str = ""  # the docs-test comment's text, "" when none
    expect: list[str] = field(default_factory=list)


def blocks(pages=PAGES) -> list[Block]:
    """The fenced blocks holding a `torchdeck ...` or `python ...` command, with their marks."""
    found = []
    for page in pages:
        lines = Path(page).read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^\s*(```+)(\w*)", lines[i])
            if not fence:
                i += 1
                continue
            start, lang = i, fence.group(2)
            i += 1
            body = []
            while i < len(lines) and not lines[i].strip().startswith(fence.group(1)):
                body.append(lines[i].strip())
                i += 1
            i += 1
            if lang in SHELL:
                commands = [b[2:] if b.startswith("$ ") else b for b in body]
            elif lang in ("", "text"):
                commands = [b[2:] for b in body if b.startswith("$ ")]
            else:
                continue
            commands = [c for c in commands if re.match(r"(torchdeck|python\d*)\s", c)]
            if not commands:
                continue
            mark = MARK.match(lines[start - 1]) if start else None
            text = mark.group(1) if mark else ""
            name = Path(page).relative_to(ROOT) if Path(page).is_relative_to(ROOT) else Path(page).name
            found.append(Block(f"{name}:{start + 1}", commands, text,
                               re.findall(r'"([^"]*)"', text) if text.startswith("expect") else []))
    return found


def shortened(command: str) -> str:
    """The command with its trailing comment dropped and SHORT's settings added."""
    line = re.sub(r"\s+#\s.*$", "", command).strip()
    for pattern, extra in SHORT:
        if pattern.match(line):
            line += " " + extra
    return line


_ran: dict[str, str] = {}  # command line -> its output: a page repeating an example shares its run


def run_block(block: Block, sandbox: Path, env: dict) -> str:
    """Run a block's commands in the sandbox; returns "" when it did what its page says, else why not."""
    said = []
    for command in block.commands:
        line = shortened(command)
        if line in _ran:
            said.append(_ran[line])
            continue
        out = subprocess.run(["bash", "-c", line], cwd=sandbox, env=env, capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL)
        said.append(out.stdout + out.stderr)
        if out.returncode == 0 and not re.search(r"\blatest\b|\bruns\b", line):  # these change as runs are added
            _ran[line] = said[-1]
        if out.returncode != 0:
            return f"{block.where}: `{line}` exited {out.returncode}:\n{(out.stdout + out.stderr)[-2000:]}"
    missing = [e for e in block.expect if not any(e in s for s in said)]
    if missing:
        return f"{block.where}: the output has no {missing}:\n{''.join(said)[-2000:]}"
    return ""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder as a new user's checkout looks to the examples (examples/ in it), with its own runs
    and presets, and the suite's torchdeck first on PATH."""
    box = tmp_path_factory.mktemp("docs-examples")
    shutil.copytree(ROOT / "examples", box / "examples")
    env = dict(os.environ, TORCHDECK_RUNS=str(box / "runs"), TORCHDECK_PRESETS=str(box / "presets"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="160")
    return box, env


def test_every_example_is_run_or_says_why_not():
    unmarked = [f"{b.where}: {b.commands}" for b in blocks() if not (b.expect or b.mark.startswith("not run: "))]
    assert not unmarked, ("give each a `<!-- docs-test: expect \"...\" -->` line (what its output shows) or "
                          "`<!-- docs-test: not run: why -->`: " + "; ".join(unmarked))


@pytest.mark.slow
def test_docs_examples_run(sandbox):
    box, env = sandbox
    runnable = [b for b in blocks() if b.expect]
    assert len(runnable) >= 5, "the README's tour alone has five"
    failed = [why for b in runnable if (why := run_block(b, box, env))]
    assert not failed, "\n\n".join(failed)


def test_a_renamed_flag_is_caught(tmp_path, sandbox):
    """The checker itself: an example whose flag was renamed fails (and the right one passes)."""
    box, env = sandbox
    page = tmp_path / "page.md"
    page.write_text('<!-- docs-test: expect "quickstart: valid" -->\n```bash\ntorchdeck validate quickstart --explian\n```\n')
    [broken] = blocks([page])
    assert "exited 2" in run_block(broken, box, env)
    page.write_text(page.read_text().replace("--explian", "--explain"))
    assert run_block(blocks([page])[0], box, env) == ""
