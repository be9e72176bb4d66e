"""Decode once (issue 17): image folders and torchvision's array sets held as uint8 tensors, one
copy per node, normalized and augmented a batch at a time; the same numbers as the per-image
torchvision path, the same weights whether cached or streamed."""
from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from PIL import Image

from torchdeck.engine import cache
from torchdeck.engine import config as cfgmod
from torchdeck.engine import events
from torchdeck.engine.data import BatchPrep, ImageTensors, augment, build_datasets, list_folder
from tests.engine.helpers import assert_same_weights, final_model, run_supervised, small_cfg


def pngs(base: Path, classes=("ant", "bee", "cat"), per_class=6, size=(20, 14), nested=False) -> Path:
    """Noisy pictures (so resizing and normalizing have something to get wrong), one folder per class."""
    g = torch.Generator().manual_seed(1)
    for ci, c in enumerate(classes):
        for i in range(per_class):
            d = base / c / ("sub" if nested and i % 2 else "")
            d.mkdir(parents=True, exist_ok=True)
            px = torch.randint(0, 256, (size[1], size[0], 3), dtype=torch.uint8, generator=g)
            px[..., ci % 3] = 40 * ci + 3 * i
            Image.fromarray(px.numpy()).save(d / f"{i:02d}.png")
    return base


def cfg_for(**data) -> cfgmod.RunConfig:
    return cfgmod.from_dict({"data": data})


def tv_folder_set(folder: Path, size: int, augment: str = "none"):
    """torchvision's per-image path for a folder, as a user's script reads it: the reference."""
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    from torchdeck.engine.data import IMAGENET_MEAN, IMAGENET_STD, crop_padding

    aug = ([T.RandomCrop(size, padding=crop_padding(size))] if "crop" in augment else []) + \
          ([T.RandomHorizontalFlip()] if "flip" in augment else [])
    return tvd.ImageFolder(str(folder), transform=T.Compose(
        [T.Resize((size, size))] + aug + [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]))


def test_decoded_folder_equals_torchvision_per_image_path(tmp_path):
    """Same files, same order, same floats, cached or streamed: resize (PIL bilinear), ToTensor, Normalize."""
    pngs(tmp_path / "train", nested=True)
    pngs(tmp_path / "val", per_class=2)
    cached, cval, info = build_datasets(cfg_for(dataset="imagefolder", root=str(tmp_path), image_size=16))
    streamed, sval, info2 = build_datasets(cfg_for(dataset="imagefolder", root=str(tmp_path), image_size=16,
                                                   cache="none"))
    ref, rval = tv_folder_set(tmp_path / "train", 16), tv_folder_set(tmp_path / "val", 16)
    assert isinstance(cached, ImageTensors) and not isinstance(streamed, ImageTensors) and info == info2
    assert [p for p, _ in list_folder(tmp_path / "train")[1]] == [p for p, _ in ref.samples] == \
        [p for p, _ in streamed.samples]
    assert streamed.classes == ref.classes and streamed.targets == ref.targets
    assert cached.tensors[0].dtype == torch.uint8 and cached.tensors[0].shape == (18, 3, 16, 16)
    for a, b, r in ((cached, streamed, ref), (cval, sval, rval)):
        assert len(a) == len(b) == len(r)
        for i in range(len(a)):
            assert torch.equal(a[i][0], r[i][0]) and int(a[i][1]) == r[i][1]
            assert torch.equal(b[i][0], r[i][0]) and b[i][1] == r[i][1]
    # A batch through the loop's path (bytes gathered, then BatchPrep) is the same as per image.
    prep = BatchPrep(cached)
    idx = torch.tensor([3, 0, 17, 9])
    batch = prep(cached.tensors[0][idx], train=False)
    assert torch.equal(batch, torch.stack([streamed[i][0] for i in idx.tolist()]))


def test_a_folder_too_big_for_the_budget_is_streamed_and_ram_keeps_it_anyway(tmp_path):
    pngs(tmp_path, per_class=40, size=(64, 64))  # 120 images x 3 x 128 x 128 = 5.6 MiB decoded
    tight = dict(dataset="imagefolder", root=str(tmp_path), image_size=128, cache_budget_mb=5)
    plan = cache.plan(cfg_for(**tight), nproc=1)
    assert not plan.use and "over the cache budget 5 MiB" in plan.line and "decoded every epoch" in plan.line
    train, _, _ = build_datasets(cfg_for(**tight))
    assert not isinstance(train, ImageTensors)
    train, _, _ = build_datasets(cfg_for(**tight, cache="ram"))
    assert isinstance(train, ImageTensors)
    assert cache.plan(cfg_for(**dict(tight, cache_budget_mb=6)), nproc=1).use


def test_budget_is_counted_for_the_node(tmp_path):
    """One shared copy counts once; without room in /dev/shm each rank holds one and all count."""
    pngs(tmp_path, per_class=40, size=(64, 64))
    c = cfg_for(dataset="imagefolder", root=str(tmp_path), image_size=128, cache_budget_mb=20)
    n = cache.plan(c, nproc=8).nbytes
    shared = cache.plan(c, nproc=8, room=10 * n + (1 << 30))
    assert shared.use and shared.shared and shared.node_bytes == n and "one copy for the node's 8 ranks" in shared.line
    apart = cache.plan(c, nproc=8, room=0)
    assert not apart.use and apart.node_bytes == 0 and "over the cache budget 20 MiB" in apart.line
    assert cache.plan(cfg_for(dataset="imagefolder", root=str(tmp_path), image_size=128, cache_budget_mb=60),
                      nproc=8, room=0).node_bytes == 8 * n


def test_validate_states_where_the_data_lives(tmp_path, capsys):
    from torchdeck.cli import main as cli

    pngs(tmp_path / "train")
    assert cli.main(["validate", "quickstart", "--set", "data.dataset=imagefolder",
                     "--set", f"data.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "data: 18 images decoded once into RAM" in out and "one copy for the node's 2 ranks" in out
    assert "cache budget" in out
    assert cli.main(["validate", "quickstart", "--set", "data.dataset=cifar10", "--set", "devices=8",
                     "--set", "data.cache=none"]) == 0
    assert "cifar10 as uint8 tensors, 176 MiB, in each of the 8 ranks" in capsys.readouterr().out


# ----------------------------------------------------------------------------- torchvision sets as tensors


def write_mnist(root: Path, n_train=40, n_val=10, folder="MNIST") -> None:
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        px = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, n, 28, 28) + px.numpy().tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">ii", 2049, n) + (torch.arange(n, dtype=torch.uint8) % 10).numpy().tobytes())


def test_mnist_is_handed_over_as_tensors_with_torchvision_s_values(tmp_path):
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    write_mnist(tmp_path)
    train, val, info = build_datasets(cfg_for(dataset="mnist", root=str(tmp_path), download=False))
    assert isinstance(train, ImageTensors) and train.tensors[0].shape == (40, 1, 28, 28) and len(val) == 10
    ref = tvd.MNIST(str(tmp_path), train=True, transform=T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))]))
    for i in (0, 7, 39):
        assert torch.equal(train[i][0], ref[i][0]) and int(train[i][1]) == ref[i][1]
    assert (tmp_path / "MNIST" / "raw" / ".torchdeck-verified").exists()  # torchvision checked it once


def write_cifar(root: Path, n_train=50, n_val=20) -> Path:
    """Files in CIFAR-10's python layout (5 train batches, a test batch, the meta file)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(2)
    for name, n in [(f"data_batch_{i}", n_train // 5) for i in range(1, 6)] + [("test_batch", n_val)]:
        data = torch.randint(0, 256, (n, 3072), dtype=torch.uint8, generator=g).numpy()
        labels = torch.randint(0, 10, (n,), generator=g).tolist()
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return folder


def test_cifar10_files_are_checked_once_then_read_as_tensors(tmp_path):
    """torchvision's md5 check refuses files that are not the real CIFAR-10; once a set has been
    checked (the stamp torchdeck leaves), later runs read the arrays without it."""
    from torchdeck.engine.data import DataError, _tv_stamp

    folder = write_cifar(tmp_path)
    with pytest.raises(DataError, match="cifar10 not found under"):
        build_datasets(cfg_for(dataset="cifar10", root=str(tmp_path), download=False))
    stamp_path, stamp = _tv_stamp("cifar10", tmp_path)
    stamp_path.write_text(stamp)  # as left by a successful check
    train, val, info = build_datasets(cfg_for(dataset="cifar10", root=str(tmp_path), download=False))
    assert isinstance(train, ImageTensors) and train.tensors[0].shape == (50, 3, 32, 32) and len(val) == 20
    batch = pickle.loads((folder / "data_batch_2").read_bytes())
    assert torch.equal(train.tensors[0][10].flatten(), torch.from_numpy(batch["data"][0]))
    assert int(train.tensors[1][10]) == batch["labels"][0]
    os.utime(folder / "data_batch_2", ns=(1, 1))  # changed since the check: checked again (and refused)
    with pytest.raises(DataError):
        build_datasets(cfg_for(dataset="cifar10", root=str(tmp_path), download=False))


# ----------------------------------------------------------------------------- augmentation


def test_batch_augmentation_is_a_padded_crop_and_a_mirror_per_image():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    out = augment(x, crop=True, flip=True, gen=g)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    windows = {(dy, dx) for dy in range(9) for dx in range(9)}
    flips = 0
    for i in range(16):
        found = [(dy, dx, f) for dy, dx in windows for f in (False, True)
                 if torch.equal(out[i], (padded[i, :, dy:dy + 32, dx:dx + 32].flip(-1) if f else
                                         padded[i, :, dy:dy + 32, dx:dx + 32]))]
        assert found, f"image {i} is no padded crop of its input"
        flips += found[0][2]
    assert 0 < flips < 16  # about half are mirrored
    only_flip = augment(x, crop=False, flip=True, gen=torch.Generator().manual_seed(3))
    assert all(torch.equal(o, i) or torch.equal(o, i.flip(-1)) for o, i in zip(only_flip, x))


def test_batch_prep_draws_the_same_crops_for_the_same_batch_and_others_for_others():
    ds = ImageTensors(torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), torch.zeros(8, dtype=torch.long),
                      (0.5,) * 3, (0.25,) * 3)
    prep = BatchPrep(ds, "crop+flip", seed=7, rank=1)
    x = ds.tensors[0]
    a, b = prep(x, epoch=2, batch=5), prep(x, epoch=2, batch=5)
    assert torch.equal(a, b) and a.dtype == torch.float32
    assert not torch.equal(a, prep(x, epoch=3, batch=5))
    assert not torch.equal(a, BatchPrep(ds, "crop+flip", seed=7, rank=0)(x, epoch=2, batch=5))
    assert torch.equal(prep(x, train=False), ds.tensors[0].float().div(255).sub(0.5).div(0.25))  # eval: no augment


def test_streamed_folder_augments_per_image(tmp_path):
    """Random crop after zero padding and horizontal flip, drawn per image from torch's generator as
    torchvision's RandomCrop and RandomHorizontalFlip draw them: the same pictures for the same seed."""
    pngs(tmp_path, size=(32, 32))
    cfg = cfg_for(dataset="imagefolder", root=str(tmp_path), cache="none", image_size=32, augment="crop+flip")
    train, _, _ = build_datasets(cfg)
    ref = tv_folder_set(tmp_path, 32, "crop+flip")
    plain = build_datasets(cfg_for(dataset="imagefolder", root=str(tmp_path), cache="none", image_size=32))[0]
    seen = set()
    for seed in range(6):
        torch.manual_seed(seed)
        ours = [train[i][0] for i in range(4)]
        torch.manual_seed(seed)
        assert all(torch.equal(x, ref[i][0]) for i, x in enumerate(ours))
        seen.add(tuple(bool(torch.equal(x, plain[i][0])) for i, x in enumerate(ours)))
    assert seen != {(True,) * 4}  # it does augment


# ----------------------------------------------------------------------------- loader defaults


def test_loader_workers_auto_picks_none_for_memory_and_the_rank_s_cores_for_disk():
    cores = os.cpu_count() or 1
    assert cache.loader_workers(-1, True, 2) == 0
    assert cache.loader_workers(-1, False, 2) == max(1, min(8, cores // 2 - 1))
    assert cache.loader_workers(-1, False, 1) == max(1, min(8, cores - 1))
    assert cache.loader_workers(3, True, 2) == 3  # what the user sets wins


# ----------------------------------------------------------------------------- one copy per node, for real


def shm_files() -> set[str]:
    return {p.name for p in Path(cache.SHM_DIR).glob(f"torchdeck-{os.getuid()}-*")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_share_one_decoded_copy_and_train_as_the_streamed_set(tmp_path):
    """2 gloo ranks through the real supervisor on a PNG folder: cached (one /dev/shm copy that the
    ranks decoded half each, gone from the file system once mapped) and streamed (decoded per image
    by loader workers) end with the same weights."""
    root = pngs(tmp_path / "pngs", classes=[f"c{i}" for i in range(4)], per_class=16, size=(16, 16))
    before = shm_files()
    base = small_cfg(strategy="ddp", devices=2, **{"model.name": "mlp", "data.dataset": "imagefolder",
                                                   "data.root": str(root), "data.image_size": 8,
                                                   "train.batch_size": 8, "train.max_steps": 6})
    runs = {}
    for mode in ("auto", "none"):
        run = tmp_path / mode
        proc = run_supervised(run, dict(base, data={**base["data"], "cache": mode}))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[mode] = run
    logs = [e["message"] for e in events.read_all(runs["auto"] / "events.jsonl") if e["kind"] == "log"]
    assert any("decoded once" in m and "one copy for the node's 2 ranks" in m for m in logs), logs
    logs = [e["message"] for e in events.read_all(runs["none"] / "events.jsonl") if e["kind"] == "log"]
    assert any("loader worker" in m for m in logs), logs
    assert shm_files() == before  # nothing left in /dev/shm
    assert_same_weights(final_model(runs["auto"])["model"], final_model(runs["none"])["model"])


@pytest.mark.timeout(120)
def test_node_share_maps_one_file_that_has_no_name_once_every_rank_has_it(tmp_path):
    """The sharing protocol itself, with two real processes standing in for two local ranks
    (a pipe as the barrier): both see the bytes the other decoded, from the same deleted file."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_share_rank, args=(r, str(tmp_path), barrier, out)) for r in range(2)]
    before = shm_files()
    for p in procs:
        p.start()
    got = [out.get(timeout=100) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert all(g["whole"] for g in got)  # each sees the half the other wrote
    assert got[0]["values"] == got[1]["values"] == [i % 251 for i in range(0, 1000, 97)]
    assert got[0]["inode"] == got[1]["inode"] and all(g["deleted"] for g in got)
    assert shm_files() == before


def _share_rank(rank, key, barrier, out):
    def fill(buf, part, parts):
        for i in range(part, 1000, parts):
            buf[i] = i % 251

    share = cache.NodeShare(rank, 2, key, barrier.wait)
    buf = cache.shared_bytes(share, "t", 1000, fill)
    maps = [ln for ln in Path("/proc/self/maps").read_text().splitlines() if "torchdeck-" in ln]
    out.put({"values": buf[::97].tolist(), "whole": bool((buf == torch.arange(1000) % 251).all()), "inode": maps[0].split()[4] if maps else None,
             "deleted": bool(maps) and maps[0].endswith("(deleted)")})
    barrier.wait()


SLOW_SET = '''
import time
import torch

class Slow(torch.utils.data.Dataset):
    """Each image takes 3 ms to read: far longer than the mlp's step on it."""
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((3, 8, 8), float(i % 4)), i % 4

def sets(cfg):
    return Slow(), None, {"num_classes": 4}
'''


def test_a_run_waiting_for_its_data_says_so_and_names_the_knob(tmp_path, monkeypatch):
    """Rank 0 logs once when the ranks spend over a quarter of an epoch waiting for batches."""
    from tests.engine.helpers import run_in_process

    name = f"tdk_slow_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SLOW_SET)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = small_cfg(**{"data.dataset": f"{name}:sets", "data.num_workers": 0, "train.batch_size": 16,
                       "train.max_steps": 0, "train.epochs": 2})
    warned = [e["message"] for e in run_in_process(tmp_path / "run", cfg)
              if e["kind"] == "log" and e.get("level") == "warning"]
    assert len(warned) == 1, warned  # once, not every epoch
    assert "data is the bottleneck" in warned[0] and "raise data.num_workers (now 0)" in warned[0]
