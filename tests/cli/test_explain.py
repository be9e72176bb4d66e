"""`torchdeck validate --explain`: every value that is not a default, and where it came from."""
from torchdeck.cli import main as cli


def test_explain_names_the_source_of_every_changed_value(tmp_path, capsys, monkeypatch):
    user = tmp_path / "presets"
    user.mkdir()
    (user / "quickstart.yaml").write_text("strategy: cpu\n")  # same name as the shipped one
    (user / "mine.yaml").write_text("name: mine\nstrategy: ddp\ndevices: 2\ntrain: {batch_size: 16, epochs: 3}\n")
    monkeypatch.setenv("TORCHDECK_PRESETS", str(user))
    monkeypatch.setenv("TORCHDECK_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cli.main(["validate", "user:mine", "--explain", "--set", "optimizer.lr=0.2", "--set", "train.epochs=3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" = ")[0].strip(): line for line in out.splitlines() if " = " in line}
    mine = f"user preset {user / 'mine.yaml'}"
    assert rows["strategy"].endswith(mine) and rows["devices"].endswith(mine)
    assert rows["train.batch_size"].endswith(mine)
    assert rows["optimizer.lr"].endswith("--set optimizer.lr=0.2")
    assert "train.epochs" not in rows  # the default (3), wherever it was written
    assert "train.log_every_n_steps" not in rows and "optimizer.name" not in rows
    assert f"TORCHDECK_PRESETS={user}: where user presets" in out and "CUDA_VISIBLE_DEVICES" not in out.split("environment")[-1]

    assert cli.main(["validate", "quickstart", "--explain"]) == 0
    out = capsys.readouterr().out
    assert [l for l in out.splitlines() if l.strip().startswith("strategy = ddp")][0].split()[-3:-1] == ["shipped", "preset"]
    assert f"a user preset {user / 'quickstart.yaml'} has the same name; the shipped one was used" in out


def _in_a_terminal(args: list[str], cwd, columns: int = 60) -> str:
    """What the real `torchdeck` prints to a terminal `columns` wide (a pty: the CLI wraps only there)."""
    import os
    import pty
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("torchdeck")
    main, sub = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), LINES="24", TORCHDECK_RUNS=str(Path(cwd) / "runs"))
    proc = subprocess.Popen([str(exe), *args], stdout=sub, stderr=sub, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_validate_and_explain_wrap_between_words_and_never_inside_a_path(tmp_path):
    """Issue 27: `validate --explain` was not wrapped, so the terminal cut `.../qu` / `ickstart.yaml`,
    and the validate items' wrap split a path with an indent inserted: pasted back, neither path
    worked. In a 60-column terminal every line fits, or is one path alone on its line, whole."""
    deep = tmp_path / "some" / "deeply" / "nested" / "project" / "folder" / "with" / "a" / "long" / "name"
    deep.mkdir(parents=True)
    preset = deep / "quickstart-copy.yaml"
    root = deep / "data-root-that-is-also-long"
    preset.write_text(f"name: deep\nstrategy: ddp\ndevices: 3\nmodel: {{name: mlp, hidden: 16}}\n"
                      f"data: {{dataset: synthetic, root: {root}}}\ntrain: {{batch_size: 2112}}\n")
    out = _in_a_terminal(["validate", str(preset), "--explain", "--set", "optimizer.lr=0.2"], tmp_path)
    lines = out.splitlines()[1:]  # the first: `PRESET: valid`, said whole
    for ln in lines:
        assert len(ln) <= 60 or len(ln.split()) == 1, f"wider than the terminal, and more than one word: {ln!r}"
    words = {w for ln in lines for w in ln.split()}
    assert str(preset) in words and str(root) in words, out  # each path whole, on a line of its own
    whole = (str(preset), str(root), str(tmp_path / "runs"))
    assert all(any(p in w for p in whole) for w in words if str(tmp_path)[:12] in w), out  # no piece of one
    assert "--set optimizer.lr=0.2" in out  # a command stays on one line
    assert "global batch: 2,112 per process x 3 x accumulation 1 =" in out.replace("\n   ", "")
    assert "6,336" in out and "ranks 0-2: cpu" in out  # and the rough edges: separators, identical ranks once
