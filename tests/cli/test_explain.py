"""`torchdeck validate --explain`: every value that is not a default, and where it came from."""
from cli import main as cli


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
