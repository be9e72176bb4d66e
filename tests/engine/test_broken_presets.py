"""Many generated broken presets: each gets a clear message naming the field, nothing starts.

Every example is a mutation of a valid preset (wrong types, unknown keys, impossible values,
broken YAML text) fed to the real `torchdeck run` entry point in-process; three more go
through a real subprocess. "Nothing starts" is checked by the runs directory never appearing
and no new child process of this test.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import psutil
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdeck.cli import main as cli
from torchdeck.engine import config as c
from torchdeck.engine.hardware import detect_hardware

BASE = {
    "name": "broken",
    "description": "a valid preset that each example breaks",
    "strategy": "ddp",
    "accelerator": "cpu",
    "devices": 2,
    "backend": "gloo",
    "model": {"name": "cnn"},
    "data": {"dataset": "synthetic", "train_size": 256, "val_size": 64},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "train": {"batch_size": 32, "epochs": 1},
    "checkpoint": {"keep_last": 2},
    "nodes": {"master_port": 0},
}


def _leaves(cls=c.RunConfig, prefix=""):
    """(dotted path, declared type) of every setting in the schema."""
    out = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, f"{prefix}{f.name}.")
        elif tp is not Any:
            out.append((prefix + f.name, tp))
    return out


LEAVES = _leaves()
SECTIONS = [""] + [f.name + "." for f in dataclasses.fields(c.RunConfig)
                   if dataclasses.is_dataclass(get_type_hints(c.RunConfig)[f.name])]
WRONG = {  # values that are never of the declared type
    int: ["abc", [1], {"a": 1}, 1.5, True],
    float: ["fast", [0.1], {"x": 1}, True],
    bool: ["yes please", 1, [True], {"on": 1}],
    str: [[1, 2], {"a": "b"}, True],
    list: ["x", 3, {"a": 1}],
    dict: ["x", [1], 2],
}
# values of another type that a field takes on purpose: script.args as one string is a command line
# (the form and a shell give one; engine.config splits it), so it is no wrong type
ACCEPTED_FORMS = {("script.args", repr("x"))}
# accelerator cuda is refused for that reason only where there is no GPU (with one GPU, `devices` is the
# field refused); where there are two, BASE would be valid and start a run.
NO_GPU = detect_hardware().gpu_count == 0
BAD_VALUES = [  # (path, values the schema must refuse)
    ("train.batch_size", [0, -1, -64]),
    ("train.grad_accum", [0, -3]),
    ("train.epochs", [-1]),
    ("train.max_steps", [-5]),
    ("train.log_every_n_steps", [0]),
    ("train.grad_clip", [-0.5]),
    ("train.precision", ["fp8", "16", "bf16", "16-mixed"]),  # 16-mixed: needs CUDA
    ("optimizer.lr", [0, -0.1]),
    ("optimizer.momentum", [1.0, -0.2, 7]),
    ("optimizer.name", ["lion", "SGD", ""]),
    ("optimizer.betas", [[0.9], [1.5, 0.9], ["a", "b"]]),
    ("scheduler.name", ["linear", "cosine_annealing"]),
    ("scheduler.gamma", [0, 1.5]),
    ("nodes.master_port", [70000, -1]),
    ("nodes.num_nodes", [0]),
    ("nodes.node_rank", [5, -1]),
    ("nodes.timeout_s", [0]),
    ("checkpoint.keep_last", [0]),
    ("data.num_workers", [-2]),  # -1 is auto
    ("data.cache", ["disk", "RAM"]),
    ("data.augment", ["rotate", "flip+crop"]),
    ("data.train_size", [0]),
    ("data.num_classes", [1]),
    ("data.pin_memory", [True]),  # on a CPU run
    ("strategy", ["ddpp", "deepspeed_stage_2", "gpu"]),  # gpu: needs cuda
    ("backend", ["nccl", "ucc"]),  # nccl: needs CUDA
    ("accelerator", ["tpu"] + (["cuda"] if NO_GPU else [])),  # cuda with devices 2: valid on a 2-GPU host
    ("devices", [0, 1, "0,1", [0, 1]]),  # ddp needs >= 2 CPU processes, given as a count
    ("init_method", ["http://host", "tcp://nohost"]),
    ("model.name", ["transformer", "resnet50"]),
    ("data.dataset", ["imagenet", "cifar100"]),
    ("schema_version", [2, 0]),
]

identifiers = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)


@st.composite
def wrong_type(draw):
    path, tp = draw(st.sampled_from(LEAVES))
    wrong = [v for v in WRONG[tp] if (path, repr(v)) not in ACCEPTED_FORMS]
    return path, draw(st.sampled_from(wrong))


@st.composite
def bad_value(draw):
    path, values = draw(st.sampled_from(BAD_VALUES))
    return path, draw(st.sampled_from(values))


@st.composite
def unknown_key(draw):
    section = draw(st.sampled_from(SECTIONS))
    known = {p.split(".")[-1] for p, _ in LEAVES if p.startswith(section) and p.count(".") == section.count(".")}
    known |= {s.rstrip(".") for s in SECTIONS if s} if not section else set()
    key = draw(identifiers.filter(lambda k: k not in known))
    return section + key, draw(st.sampled_from([1, "x", True, [1], {"a": 1}]))


def _set(data, path, value):
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return False  # a parent was already broken by another mutation
    node[parts[-1]] = value
    return True


def _mutated(mutations):
    import copy

    data = copy.deepcopy(BASE)
    applied = [path for path, value in mutations if _set(data, path, value)]
    return data, applied


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _each_value_sourced(line: str, preset: Path) -> bool:
    """A rule broken by values from different places (a --set and the preset: issue 27 bug 8) names
    each value with its own: `field: why (strategy dp from --set, accelerator cpu from PRESET)`."""
    said = re.search(r" \(([^()]+)\)$", line)
    if not said:
        return False
    sources = [item.rpartition(" from ")[2] for item in said.group(1).split(", ")]
    return (all(" from " in item for item in said.group(1).split(", ")) and len(set(sources)) > 1
            and set(sources) <= {"--set", str(preset), "the default"})


def check_refused(preset: Path, runs: Path, capsys, must_name=(), extra=()):
    before = _children()
    code = cli.main(["run", str(preset), "--runs-dir", str(runs), *extra])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert lines, "a message on stderr"
    for line in lines:
        assert line.startswith(f"{preset}: ") or line.startswith("--set: ") or _each_value_sourced(line, preset), line
    if must_name:
        assert any(p in err for p in must_name), (must_name, err)
    else:
        assert re.search(r"line \d+, column \d+", err) or re.search(r": [a-z_]+(\.[a-z_]+)*: ", err), err
    assert not runs.exists(), "no run directory may be created"
    assert _children() <= before, "no process may be started"
    return err


SETTINGS = settings(max_examples=int(os.environ.get("BROKEN_PRESET_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(st.lists(st.one_of(wrong_type(), bad_value(), unknown_key()), min_size=1, max_size=3))
def test_generated_broken_presets_are_refused(tmp_path, capsys, mutations):
    data, applied = _mutated(mutations)
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    check_refused(preset, tmp_path / "runs", capsys, must_name=applied)


@SETTINGS
@given(st.one_of(wrong_type(), bad_value()))
def test_broken_overrides_are_refused(tmp_path, capsys, mutation):
    path, value = mutation
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(BASE))
    raw = value if isinstance(value, str) else json.dumps(value)  # JSON is YAML: --set reads it back
    check_refused(preset, tmp_path / "runs", capsys, must_name=[path], extra=["--set", f"{path}={raw}"])


def _valid_text():
    return yaml.safe_dump(BASE, sort_keys=False)


@st.composite
def broken_yaml(draw):
    """Text edits that always break YAML: unclosed brackets or quotes, a second ': ' on a line."""
    lines = _valid_text().splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    kind = draw(st.sampled_from(["open", "quote", "colon", "tab"]))
    line = lines[i]
    if kind == "open":
        lines[i] = draw(st.sampled_from(["{", "["])) + line
    elif kind == "quote":
        head, sep, tail = line.partition(": ")
        lines[i] = head + sep + draw(st.sampled_from(['"', "'"])) + tail if sep else '"' + line
    elif kind == "colon":
        head, sep, tail = line.partition(": ")
        lines[i] = (line + ": x: y") if sep and tail else ("a: b: " + line.strip())
    else:
        lines.insert(i + 1, "\t  oops: 1") if i + 1 < len(lines) and lines[i + 1].startswith(" ") else lines.insert(i, "x:\n\t- 1")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(broken_yaml())
def test_broken_yaml_text_reports_line_and_column(tmp_path, capsys, text):
    preset = tmp_path / "p.yaml"
    preset.write_text(text)
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as exc:
        err = check_refused(preset, tmp_path / "runs", capsys)
        mark = exc.problem_mark
        assert f"line {mark.line + 1}, column {mark.column + 1}" in err
        return
    pytest.fail(f"the edit did not break the YAML:\n{text}")


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n", "just words\n", "", "\x00\x01binary"])
def test_not_a_mapping(tmp_path, capsys, text):
    preset = tmp_path / "p.yaml"
    preset.write_text(text)
    if text == "":
        # an empty preset is the all-defaults config, which is valid: validate, do not run
        assert cli.main(["validate", str(preset)]) == 0
        return
    err = check_refused(preset, tmp_path / "runs", capsys, must_name=["mapping", "YAML", "line"])
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text,want", [
    ("strategy: ddp\ntrain:\n  batch_size: [64\n", re.compile(r"broken YAML at line \d+, column \d+")),
    ("strategy: ddp\ndevices: 2\ntrian:\n  epochs: 1\n", re.compile(r"trian: unknown key \(did you mean 'train'\?\)")),
    ("strategy: ddp\ndevices: 2\ntrain:\n  batch_size: lots\n", re.compile(r"train\.batch_size: must be an integer")),
])
def test_broken_presets_via_real_subprocess(tmp_path, text, want):
    preset = tmp_path / "p.yaml"
    preset.write_text(text)
    exe = Path(sys.executable).with_name("torchdeck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "torchdeck.cli"]
    r = subprocess.run(cmd + ["run", str(preset)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs")))
    assert r.returncode == 2
    assert want.search(r.stderr), r.stderr
    assert r.stderr.startswith(f"{preset}: ")
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "runs").exists()
    r = subprocess.run(cmd + ["run", str(preset), "--debug"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, TORCHDECK_RUNS=str(tmp_path / "runs")))
    assert r.returncode == 2 and "Traceback" in r.stderr  # --debug shows where it came from


def test_the_unbroken_preset_is_valid(tmp_path, capsys):
    """Otherwise every example above would be refused for the wrong reason."""
    preset = tmp_path / "p.yaml"
    preset.write_text(_valid_text())
    assert cli.main(["validate", str(preset)]) == 0, capsys.readouterr().err
