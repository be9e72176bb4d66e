"""Data sets for a run: a built-in synthetic set, torchvision sets, ImageFolder or a user callable;
and the loader that feeds a rank's training loop from them (TrainData).

Imported only by workers, so torch is imported at the top (torchvision only where a set needs it). Every failure a user
can cause (missing files, no network, a bad import path) becomes one DataError with a message
that names the data set and says what to do, never a raw traceback.
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from . import affinity, cache
from .cache import NodeShare
from .errors import DataError, TorchdeckError  # noqa: F401  (DataError: data.DataError for callers)

# Fixed, so the synthetic set is the same in every process and every run, whatever train.seed is.
SYNTHETIC_SEED = 20240917


IMAGE_FIELDS = ("in_channels", "num_classes", "image_size")
_BUILTIN_IMAGE_MODELS = "cnn, mlp and resnet18"


class MissingInfo(DataError, AttributeError):
    """A model read an image field the data set does not have (tabular, token or dict data)."""


class DataInfo(Mapping):
    """What a model needs to know about the data. A user's model callable gets it, and may read
    it as `info.in_channels` or `info["in_channels"]` (a read-only mapping of its keys).

    in_channels, num_classes and image_size are for image data and may be unknown (None) for
    other data (tabular rows, token ids, dict samples): reading one that is unknown raises a
    MissingInfo naming what the built-in image models need (getattr(info, key, None) and
    info.get(key) give None). Any other key the data callable's info dict names (vocab_size,
    num_features...) reads the same way."""

    def __init__(self, in_channels=None, num_classes=None, image_size=None, name: str = "", **extra):
        values = {"in_channels": in_channels, "num_classes": num_classes, "image_size": image_size, "name": name}
        values.update(extra)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, key: str):
        values = self.__dict__.get("_values", {})
        if key not in values:
            raise AttributeError(f"data info has no {key!r} (it has {', '.join(values)})")
        v = values[key]
        if v is None and key in IMAGE_FIELDS:
            raise MissingInfo(
                f"{values.get('name') or 'the data set'} has no {key} (not image data, or its info dict does not say "
                f"it and the data cannot tell): the built-in models {_BUILTIN_IMAGE_MODELS} need in_channels, "
                "image_size and num_classes; return them in the info dict (train, val, {...}), or use a model "
                "of your own (model.name: package.module:callable)")
        return v

    def __setattr__(self, key, value):
        raise AttributeError("data info is read-only")

    def known(self, key: str, default=None):
        """The value, or `default` where it is unknown (never raises)."""
        v = self._values.get(key)
        return default if v is None else v

    def __getitem__(self, key: str):
        if key not in self._values:
            raise KeyError(f"{key!r}: data info has {', '.join(self._values)}")
        return getattr(self, key)

    def get(self, key, default=None):
        return self.known(key, default)

    def __contains__(self, key) -> bool:
        return self._values.get(key) is not None

    def __iter__(self):  # the keys it knows: dict(info) holds no None
        return iter([k for k, v in self._values.items() if v is not None])

    def __len__(self) -> int:
        return sum(1 for v in self._values.values() if v is not None)

    def __eq__(self, other) -> bool:
        return isinstance(other, DataInfo) and self._values == other._values

    __hash__ = None

    def __repr__(self) -> str:
        return "DataInfo(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def __getstate__(self):
        return dict(self._values)

    def __setstate__(self, state):
        object.__setattr__(self, "_values", dict(state))


# ----------------------------------------------------------------------------- synthetic


def _templates(num_classes: int, channels: int, size: int, gen: torch.Generator,
               grid: int, colour_scale: float) -> torch.Tensor:
    """One smooth pattern plus a colour per class: learnable, but not from one pixel."""
    coarse = torch.randn(num_classes, channels, grid, grid, generator=gen)
    pattern = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    pattern = pattern / pattern.flatten(1).std(dim=1).view(-1, 1, 1, 1)
    colour = torch.randn(num_classes, channels, 1, 1, generator=gen) * colour_scale
    return pattern + colour


def _samples(templates: torch.Tensor, n: int, size: int, pad: int, noise: float,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    k, c = templates.shape[:2]
    labels = torch.randint(0, k, (n,), generator=gen)
    span = 2 * pad + 1
    shift = torch.randint(0, span * span, (n,), generator=gen)
    x = torch.empty(n, c, size, size)
    for s in range(span * span):  # one slice per shift: far faster than a per-pixel gather
        idx = (shift == s).nonzero().squeeze(1)
        dy, dx = divmod(s, span)
        x[idx] = templates[:, :, dy:dy + size, dx:dx + size][labels[idx]]
    scale = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=gen)
    x.mul_(scale).add_(torch.randn(x.shape, generator=gen), alpha=noise)
    return x, labels


def synthetic(train_size: int, val_size: int, num_classes: int, image_size: int,
              channels: int = 3, noise: float = 4.5, pad: int = 3,
              grid: int = 8, colour_scale: float = 0.2) -> tuple[TensorDataset, TensorDataset | None]:
    """Shifted, scaled, noisy class templates; train and val use separate streams of the same seed.

    The noise is tuned: an untrained model is at chance, the tutorial CNN (SGD lr 0.05, momentum
    0.9) passes 90 % validation accuracy within 1-2 epochs at batch 64 to 128. With much less
    noise the smooth, correlated inputs make that learning rate diverge.
    """
    size = image_size
    tgen = torch.Generator().manual_seed(SYNTHETIC_SEED)
    templates = _templates(num_classes, channels, size + 2 * pad, tgen, grid, colour_scale)
    x_tr, y_tr = _samples(templates, train_size, size, pad, noise,
                          torch.Generator().manual_seed(SYNTHETIC_SEED + 1))
    mean, std = x_tr.mean().item(), x_tr.std().item()
    train = TensorDataset(x_tr.sub_(mean).div_(std), y_tr)
    if val_size == 0:
        return train, None
    x_va, y_va = _samples(templates, val_size, size, pad, noise,
                          torch.Generator().manual_seed(SYNTHETIC_SEED + 2))
    return train, TensorDataset(x_va.sub_(mean).div_(std), y_va)


# ----------------------------------------------------------------------------- decoded images


class ImageTensors(TensorDataset):
    """uint8 images (N, C, H, W) and int64 labels, as decoded once (engine/cache.py). One sample
    at a time it yields normalized floats, exactly as ToTensor + Normalize would; the training
    loop fetches whole batches of bytes and normalizes them with BatchPrep instead."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std, shared_by: int = 1):
        super().__init__(images, labels)
        self.shared_by = shared_by  # ranks mapping this one copy
        c = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(c, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(c, 1, 1)

    def __getitem__(self, i):
        x, y = self.tensors[0][i], self.tensors[1][i]
        return x.float().div_(255).sub_(self.mean).div_(self.std), y


class BatchPrep:
    """What the loop does to a whole batch once fetched: bytes -> normalized floats (the same
    arithmetic as ToTensor + Normalize) and data.augment (random crop after zero padding of size/8,
    horizontal flip), drawn from a generator seeded by (seed, epoch, batch, rank): a resumed run
    sees the crops an uninterrupted one does, and no global RNG is touched."""

    def __init__(self, dataset, augment: str = "none", seed: int = 0, rank: int = 0, device=None):
        self.normalize = isinstance(dataset, ImageTensors)
        if self.normalize:
            self.mean, self.std = dataset.mean.to(device), dataset.std.to(device)
        self.crop, self.flip = "crop" in augment, "flip" in augment
        self.seed, self.rank = seed, rank
        self.gen = torch.Generator()

    @property
    def active(self) -> bool:
        return self.normalize or self.crop or self.flip

    def __call__(self, x: torch.Tensor, epoch: int = 0, batch: int = 0, train: bool = True) -> torch.Tensor:
        if train and (self.crop or self.flip):
            self.gen.manual_seed(hash((self.seed, epoch, batch, self.rank)) & (2 ** 62 - 1))
            x = augment(x, self.crop, self.flip, self.gen)
        if self.normalize:
            x = x.float().div_(255).sub_(self.mean).div_(self.std)
        return x


def crop_padding(size: int) -> int:
    return max(1, size // 8)  # 4 for 32x32 images, as the CIFAR-10 recipes pad


def augment(x: torch.Tensor, crop: bool, flip: bool, gen: torch.Generator) -> torch.Tensor:
    """Random crop and horizontal flip, per image, for a whole (B, C, H, W) batch in one gather."""
    b, c, h, w = x.shape
    dev = x.device
    if crop:
        pad = crop_padding(h)
        x = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b, 1), generator=gen)
        dx = torch.randint(0, 2 * pad + 1, (b, 1), generator=gen)
    else:
        dy = dx = torch.zeros(b, 1, dtype=torch.long)
    rows = dy + torch.arange(h)
    cols = dx + torch.arange(w)
    if flip:
        cols = torch.where(torch.rand(b, 1, generator=gen) < 0.5, cols.flip(1), cols)
    rows, cols = rows.to(dev).view(b, 1, h, 1), cols.to(dev).view(b, 1, 1, w)
    return x[torch.arange(b, device=dev).view(b, 1, 1, 1), torch.arange(c, device=dev).view(1, c, 1, 1), rows, cols]


def _as_bytes(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


# ----------------------------------------------------------------------------- torchvision sets

# name: (class name in torchvision.datasets, channels, size, classes, mean, std)
_TV = {
    "cifar10": ("CIFAR10", 3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "mnist": ("MNIST", 1, 28, 10, (0.1307,), (0.3081,)),
    "fashionmnist": ("FashionMNIST", 1, 28, 10, (0.2860,), (0.3530,)),
}


@contextlib.contextmanager
def _download_lock(root: Path):
    """Ranks on one host share the root: one downloads while the others wait, then all read."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".torchdeck-download.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tv_hint(name: str, where: Path) -> str:
    return (f"{name} not found under {where}: connect to the internet and set data.download: true, "
            f"or put the files there (torchvision layout) — see torchvision.datasets.{_TV[name][0]}")


def _torchvision_verify(name: str, where: Path, download: bool) -> None:
    """Let torchvision fetch and check the files (md5 for CIFAR-10) once; a stamp of what it
    checked (names, sizes, times) spares later runs its import and the checksums."""
    stamp_path, stamp = _tv_stamp(name, where)
    if stamp is not None and stamp_path.exists() and stamp_path.read_text() == stamp:
        return
    import torchvision.datasets as tvd

    cls = getattr(tvd, _TV[name][0])
    try:
        lock = _download_lock(where) if download else contextlib.nullcontext()
        with lock:
            for train in (True, False):
                cls(str(where), train=train, download=download)
    except Exception as exc:  # torchvision raises RuntimeError, URLError, OSError, ...
        reason = f" (download failed: {' '.join(str(exc).split())})" if download else ""
        raise DataError(_tv_hint(name, where) + reason) from None
    stamp_path, stamp = _tv_stamp(name, where)
    if stamp is not None:
        with contextlib.suppress(OSError):
            stamp_path.write_text(stamp)


def tv_folder(name: str, where: Path) -> Path:
    return where / "cifar-10-batches-py" if name == "cifar10" else where / _TV[name][0] / "raw"


TV_FILES = {"cifar10": ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                        "test_batch", "batches.meta"),
            "mnist": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                      "t10k-labels-idx1-ubyte")}
TV_FILES["fashionmnist"] = TV_FILES["mnist"]


def _tv_stamp(name: str, where: Path) -> tuple[Path, str | None]:
    folder = tv_folder(name, where)
    try:
        parts = [f"{f} {(folder / f).stat().st_size} {(folder / f).stat().st_mtime_ns}" for f in TV_FILES[name]]
    except OSError:
        return folder / ".torchdeck-verified", None
    return folder / ".torchdeck-verified", "\n".join(parts) + "\n"


def _read_idx(path: Path) -> torch.Tensor:
    """An MNIST idx file (big-endian header: magic, dims) as a uint8 tensor."""
    import numpy as np

    raw = path.read_bytes()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape).copy())


def _read_tv_arrays(name: str, where: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images N x C x H x W, int64 labels) straight from torchvision's files."""
    folder = tv_folder(name, where)
    if name == "cifar10":
        import pickle

        import numpy as np

        data, labels = [], []
        for f in (TV_FILES[name][:5] if train else ("test_batch",)):
            with open(folder / f, "rb") as fh:
                entry = pickle.load(fh, encoding="latin1")
            data.append(entry["data"])
            labels += entry["labels"]
        return torch.from_numpy(np.concatenate(data).reshape(-1, 3, 32, 32)), torch.tensor(labels, dtype=torch.int64)
    prefix = "train" if train else "t10k"
    images = _read_idx(folder / f"{prefix}-images-idx3-ubyte").unsqueeze(1)
    return images, _read_idx(folder / f"{prefix}-labels-idx1-ubyte").to(torch.int64)


def _torchvision_set(name: str, root: str, download: bool, share: NodeShare | None):
    """CIFAR-10, MNIST, FashionMNIST as ImageTensors: the files are arrays already, so they are read
    straight into uint8 tensors, never turned into PIL images (torchvision only downloads and
    checks them, once). With a node share, local rank 0 reads the files and the node's ranks map
    its one copy."""
    _, channels, size, classes, mean, std = _TV[name]
    where = Path(root).expanduser()
    per = channels * size * size

    def read(train: bool) -> torch.Tensor:
        _torchvision_verify(name, where, download)
        try:
            images, labels = _read_tv_arrays(name, where, train)
        except Exception as exc:
            raise DataError(f"{name} under {where}: cannot read {tv_folder(name, where)}: {type(exc).__name__}: "
                            f"{exc}; delete it and download again (data.download: true)") from None
        if tuple(images.shape[1:]) != (channels, size, size) or len(labels) != len(images):
            raise DataError(f"{name} under {where}: unexpected images {tuple(images.shape)}, {len(labels)} labels; "
                            f"expected N x {channels} x {size} x {size} and N labels")
        return _as_bytes(images, labels)

    sets = []
    for split in ("train", "val"):
        flat = cache.shared_bytes(share, f"{name}-{split}", None, lambda *_: read(split == "train"))
        n = flat.numel() // (per + 8)
        sets.append(ImageTensors(flat[:n * per].view(n, channels, size, size), flat[n * per:].view(torch.int64),
                                 mean, std, share.local_world if share else 1))
    return sets[0], sets[1], DataInfo(channels, classes, size, name)


# ----------------------------------------------------------------------------- image folder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _image_folder(root: str, image_size: int, use_cache: bool, share: NodeShare | None, augment: str = "none"):
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataError(f"imagefolder: {base} is not a folder; set data.root to a folder with one "
                        "sub-folder of images per class (or train/ and val/ holding those)")
    split = (base / "train").is_dir()
    train_dir = base / "train" if split else base
    val_dir = base / "val" if split and (base / "val").is_dir() else None
    try:
        classes, train = list_folder(train_dir)
        val_classes, val = list_folder(val_dir) if val_dir else (classes, None)
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"imagefolder {base}: {exc}; each class needs its own sub-folder of images") from None
    if val_classes != classes:
        raise DataError(f"imagefolder {base}: train/ and val/ have different class folders "
                        f"({classes} vs {val_classes}); give both the same classes")
    info = DataInfo(3, len(classes), image_size, f"imagefolder:{base}")
    if use_cache:
        return (_decoded(train, image_size, share, "train"),
                _decoded(val, image_size, share, "val") if val is not None else None, info)
    return (FolderImages(train, classes, image_size, augment),
            FolderImages(val, classes, image_size) if val is not None else None, info)


def list_folder(folder: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes and (path, class) samples in torchvision ImageFolder's order (sorted class folders,
    files sorted within a sorted walk of each), so the cached and streamed sets agree."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {folder}.")
    samples, empty = [], []
    for idx, name in enumerate(classes):
        before = len(samples)
        for root, _, files in sorted(os.walk(os.path.join(folder, name), followlinks=True)):
            samples += [(os.path.join(root, f), idx) for f in sorted(files) if f.lower().endswith(cache.IMG_EXTENSIONS)]
        if len(samples) == before:
            empty.append(name)
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}. "
                                f"Supported extensions are: {', '.join(cache.IMG_EXTENSIONS)}")
    return classes, samples


def read_image(path: str, size: int):
    """One picture as RGB uint8 (H, W, C), resized to size x size as transforms.Resize does with PIL."""
    import numpy as np
    from PIL import Image

    try:
        with open(path, "rb") as fh:
            img = Image.open(fh).convert("RGB")
    except Exception as exc:
        raise DataError(f"imagefolder: cannot read {path}: {type(exc).__name__}: {exc}") from None
    if img.size != (size, size):
        img = img.resize((size, size), Image.BILINEAR)
    return np.asarray(img)


class FolderImages(Dataset):
    """An image folder read one picture at a time (data.cache none, or over the budget): the files,
    order and floats of torchvision's ImageFolder through Resize, [RandomCrop with zero padding,
    RandomHorizontalFlip,] ToTensor and Normalize, their random draws made the same way; without
    importing torchvision, which pulls torch._dynamo into the rank and its loader workers' server
    (seconds of CPU each, for reading pictures)."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], size: int, augment: str = "none"):
        self.samples, self.classes, self.size = samples, classes, size
        self.targets = [c for _, c in samples]
        self.crop, self.flip = "crop" in augment, "flip" in augment
        # made once here, not per picture: __getitem__ runs for every sample of every epoch
        self.mean, self.std = (torch.tensor(v).view(-1, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        x = torch.from_numpy(read_image(path, self.size).copy()).permute(2, 0, 1)
        if self.crop:
            pad, n = crop_padding(self.size), self.size
            x = F.pad(x, (pad, pad, pad, pad))
            top = torch.randint(0, 2 * pad + 1, size=(1,)).item()
            left = torch.randint(0, 2 * pad + 1, size=(1,)).item()
            x = x[:, top:top + n, left:left + n]
        if self.flip and torch.rand(1) < 0.5:
            x = x.flip(-1)
        return x.float().div_(255).sub_(self.mean).div_(self.std), label


def _decoded(samples: list[tuple[str, int]], size: int, share: NodeShare | None, split: str) -> ImageTensors:
    """Every image decoded (and resized, as transforms.Resize does with PIL) once into uint8, each
    local rank decoding its share into the node's one copy, with its own threads."""
    n, per = len(samples), 3 * size * size

    def fill(buf: torch.Tensor, part: int, parts: int) -> None:
        images = buf.numpy().reshape(n, 3, size, size)

        def one(i: int) -> None:
            images[i] = read_image(samples[i][0], size).transpose(2, 0, 1)

        mine = range(part, n, parts)
        threads = torch.get_num_threads()
        if threads > 1 and len(mine) > 64:  # PIL decodes outside the GIL
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, mine, chunksize=32))
        else:
            for i in mine:
                one(i)

    flat = cache.shared_bytes(share, f"folder-{split}", n * per, fill)
    return ImageTensors(flat.view(n, 3, size, size), torch.tensor([c for _, c in samples], dtype=torch.int64),
                        IMAGENET_MEAN, IMAGENET_STD, share.local_world if share else 1)


# ----------------------------------------------------------------------------- user callable


def _load_callable(path: str, kind: str, error: type[Exception]):
    """Import `package.module:callable`; shared with engine.models. Where it looks is
    engine.usercode's one rule (sys.path, then the user's folders)."""
    from .usercode import load_callable

    return load_callable(path, kind, error)


def _infer_info(path: str, train: Dataset, given: dict) -> DataInfo:
    """Fill what the callable did not say from the first sample and the labels it exposes."""
    info = dict(given)
    if "in_channels" not in info or "image_size" not in info or "num_classes" not in info:
        try:
            sample = train[0]
        except Exception as exc:
            raise DataError(f"data.dataset {path!r}: reading train[0] failed: {type(exc).__name__}: {exc}") from None
        x = sample[0] if isinstance(sample, (tuple, list)) and sample else None
        if isinstance(x, torch.Tensor) and x.dim() >= 2:  # (image, ...): its channels and side
            info.setdefault("in_channels", int(x.shape[0]) if x.dim() == 3 else 1)
            info.setdefault("image_size", int(x.shape[-1]))
    if "num_classes" not in info:  # integer labels only: float targets are not classes
        if hasattr(train, "classes"):
            info["num_classes"] = len(train.classes)
        elif isinstance(train, TensorDataset) and len(train.tensors) > 1 and not train.tensors[-1].is_floating_point():
            info["num_classes"] = int(train.tensors[-1].max()) + 1
        elif hasattr(train, "targets"):
            targets = torch.as_tensor(train.targets)
            if not targets.is_floating_point():
                info["num_classes"] = int(targets.max()) + 1
    info.setdefault("name", path)
    try:
        for key in IMAGE_FIELDS:
            info[key] = None if info.get(key) is None else int(info[key])
        info["name"] = str(info["name"])
    except (TypeError, ValueError) as exc:
        raise DataError(f"data.dataset {path!r}: bad info dict {given!r}: {exc}") from None
    bad = [k for k in info if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise DataError(f"data.dataset {path!r}: info dict keys must be names, got {bad!r}")
    return DataInfo(**info)


def _user_set(path: str, cfg):
    fn = _load_callable(path, "data.dataset", DataError)
    try:
        out = fn(cfg)
    except Exception as exc:
        raise DataError(f"data.dataset {path!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise DataError(f"data.dataset {path!r} must return (train, val) or (train, val, info_dict); "
                        f"got {type(out).__name__}")
    train, val = out[0], out[1]
    given = out[2] if len(out) == 3 and out[2] is not None else {}
    if not isinstance(given, dict):
        raise DataError(f"data.dataset {path!r}: the third value must be a dict, got {type(given).__name__}")
    return train, val, _infer_info(path, train, given)


# ----------------------------------------------------------------------------- entry point


def build_datasets(cfg, share: NodeShare | None = None) -> tuple[Dataset, Dataset | None, DataInfo]:
    """The train set, the val set (None when there is no val split) and what the model needs.

    Image folders that fit the cache budget and torchvision's array sets come back as
    ImageTensors (decoded once; one copy for the node's ranks through `share`, engine/cache.py).
    A user callable `package.module:callable` is called as callable(cfg) and returns
    (train, val) or (train, val, {"in_channels", "num_classes", "image_size", "name"});
    missing info keys are read from train[0] and the data set's classes/targets.
    """
    d = cfg.data
    name = d.dataset
    if name == "synthetic":
        train, val = synthetic(d.train_size, d.val_size, d.num_classes, d.image_size)
        return train, val, DataInfo(3, d.num_classes, d.image_size, "synthetic")
    if name in _TV or name == "imagefolder":
        plan = cache.plan(cfg, share.local_world if share else 1)
        use, shared = share.all_agree([plan.use, plan.shared]) if share else (plan.use, False)
        node_share = share if shared else None
        if name in _TV:
            return _torchvision_set(name, d.root, d.download, node_share)
        return _image_folder(d.root, d.image_size, use, node_share, d.augment)
    if name == "text":  # bytes of a text file or folder as tokens (engine/text.py)
        from .text import block_size_of, text_datasets

        train, val, info = text_datasets(d.root, block_size_of(cfg))
        return train, val, DataInfo(**info)
    if ":" in name:
        return _user_set(name, cfg)
    raise DataError(f"data.dataset: unknown data set {name!r}; use synthetic, cifar10, mnist, "
                    "fashionmnist, imagefolder, text or package.module:callable")


# ----------------------------------------------------------------------------- the training loader


class SkipSampler(torch.utils.data.Sampler):
    """Wraps an epoch sampler and drops its first `skip` indices: resume mid-epoch without loading them."""

    def __init__(self, inner):
        self.inner = inner
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __iter__(self):
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self):
        return max(0, len(self.inner) - self.skip)


class BatchTensors(Dataset):
    """An in-memory TensorDataset fetched a whole batch at a time: one gather per tensor instead of
    batch_size single-item lookups and a stack (measured ~355 -> ~150 us for 64 32x32 images, about
    4 % of a CPU step of the tutorial CNN; same rows, same order). With data.on_device the tensors
    are copied to the GPU once, so a batch is one gather there and no host-to-device copy."""

    def __init__(self, dataset, device=None):
        self.tensors = [t.to(device) if device is not None else t for t in dataset.tensors]

    def __len__(self):
        return self.tensors[0].shape[0]

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)

    def __getitems__(self, indices):  # DataLoader fetches a whole batch with this when present
        ix = torch.as_tensor(indices, device=self.tensors[0].device)
        return [t[ix] for t in self.tensors]


def keep_batch(batch):
    """collate_fn for BatchTensors: the batch is already stacked."""
    return batch


def default_sampler(dataset, seed: int):
    """One process: exactly the order DistributedSampler gives one replica, so 1 x 2B == 2 ranks x B."""
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)


class TrainData:
    """A rank's data sets and the loader that feeds its training loop. Made in two steps, the
    model built in between: the loader workers' fork server imports torch meanwhile, and the
    sampler (whose share of the set the loader reads) is the strategy's."""

    def __init__(self, cfg, ctx, share: NodeShare | None):
        d = cfg.data
        self.cfg, self.ctx = cfg, ctx
        self.train_ds, self.val_ds, self.info = build_datasets(cfg, share)
        self.in_memory = isinstance(self.train_ds, TensorDataset)
        self.on_device = d.on_device and self.in_memory  # already on the GPU: no workers, no pinning
        cheap = self.in_memory or getattr(self.train_ds, "in_memory", False) is True  # a set that says so
        self.workers = 0 if self.on_device else cache.loader_workers(d.num_workers, cheap, ctx.local_world_size)
        self._start = cache.worker_start(d.worker_start, self.workers)
        self.worker_start = self._start.get("multiprocessing_context")  # None: the platform's default
        self.forks_workers = self.worker_start == "fork"  # (worker_start is None without workers)
        cache.start_worker_server(self._start, ":" in d.dataset)  # it imports torch while this rank builds its model

    def open_loader(self, inner, emit) -> None:
        """The loader over the strategy's sampler `inner` (None: one process's order), wrapped so a
        resumed epoch skips what was trained; and the preparation of each fetched batch."""
        cfg, ctx, t, d = self.cfg, self.ctx, self.cfg.train, self.cfg.data
        device = ctx.device
        self.inner = inner if inner is not None else default_sampler(self.train_ds, t.seed)
        self.sampler = SkipSampler(self.inner)
        if d.on_device and not self.in_memory and ctx.rank == 0:
            emit("log", level="warning", message=f"data.on_device: {self.info.name} is not an in-memory "
                                                 "tensor data set; loading batches as usual")
        workers = self.workers
        self.loader = DataLoader(
            BatchTensors(self.train_ds, device if self.on_device else None) if self.in_memory else self.train_ds,
            batch_size=t.batch_size, sampler=self.sampler, drop_last=True,
            collate_fn=keep_batch if self.in_memory else None, num_workers=workers,
            pin_memory=d.pin_memory and device.type == "cuda" and not self.on_device,
            persistent_workers=d.persistent_workers and workers > 0,
            prefetch_factor=d.prefetch_factor if workers > 0 else None,
            **self._start,  # not spawn, as the rank was: no torch import in each worker
            **affinity.loader_kwargs())  # workers off their rank's bound cores
        # Decoded bytes become normalized floats (and augmented) a whole batch at a time, on the device.
        self.prep = BatchPrep(self.train_ds, d.augment, t.seed, ctx.rank, device)
        self.val_prep = BatchPrep(self.val_ds, device=device) if self.val_ds is not None else None

    def note(self) -> str:
        """How the batches come, for the run's log."""
        ds = self.train_ds
        if isinstance(ds, ImageTensors):
            mb = sum(t.numel() * t.element_size() for t in ds.tensors) / 2 ** 20
            who = f"one copy for the node's {ds.shared_by} ranks" if ds.shared_by > 1 else "in this process"
            return f"decoded once: {mb:.0f} MiB of uint8 in memory, {who}"
        if self.in_memory:
            return "in memory"
        if not self.workers:
            return "read in the training process"
        return f"read by {self.workers} loader worker(s) per rank, {cache.start_said(self.worker_start)}"

    def bottleneck_knob(self) -> str:
        """What to turn when the ranks wait for batches."""
        d = self.cfg.data
        if self.in_memory:
            return ("batches come from memory, so the CPU is short: lower train.threads_per_rank or run fewer "
                    "ranks per host")
        knob = f"raise data.num_workers (now {self.workers})"
        if d.dataset == "imagefolder":
            knob += (" or decode the set once: data.cache: auto" if d.cache == "none" else
                     " or let the set be decoded once in RAM: raise data.cache_budget_mb (or data.cache: ram)")
        return knob
