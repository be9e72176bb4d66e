"""Data sets for a run: a built-in synthetic set, torchvision sets, ImageFolder or a user callable.

Imported only by workers, so torch and torchvision are imported at the top. Every failure a user
can cause (missing files, no network, a bad import path) becomes one DataError with a message
that names the data set and says what to do, never a raw traceback.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from engine.errors import TorchdeckError

# Fixed, so the synthetic set is the same in every process and every run, whatever train.seed is.
SYNTHETIC_SEED = 20240917


class DataError(TorchdeckError):
    """One clear message naming the data set/root and what to do."""


@dataclass
class DataInfo(Mapping):
    """What a model needs to know about the data. A user's model callable gets it, and may read
    it as `info.in_channels` or `info["in_channels"]` (a read-only mapping of these four keys)."""

    in_channels: int
    num_classes: int
    image_size: int
    name: str

    def __getitem__(self, key: str):
        if key not in self._keys():
            raise KeyError(f"{key!r}: data info has {', '.join(self._keys())}")
        return getattr(self, key)

    def __iter__(self):
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


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


def _torchvision_set(name: str, root: str, download: bool):
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    cls_name, channels, size, classes, mean, std = _TV[name]
    cls = getattr(tvd, cls_name)
    tf = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    where = Path(root).expanduser()
    hint = (f"{name} not found under {where}: connect to the internet and set data.download: true, "
            f"or put the files there (torchvision layout) — see torchvision.datasets.{cls_name}")
    try:
        lock = _download_lock(where) if download else contextlib.nullcontext()
        with lock:
            train = cls(str(where), train=True, download=download, transform=tf)
            val = cls(str(where), train=False, download=download, transform=tf)
    except DataError:
        raise
    except Exception as exc:  # torchvision raises RuntimeError, URLError, OSError, ...
        reason = f" (download failed: {' '.join(str(exc).split())})" if download else ""
        raise DataError(hint + reason) from None
    return train, val, DataInfo(channels, classes, size, name)


# ----------------------------------------------------------------------------- image folder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _image_folder(root: str, image_size: int):
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataError(f"imagefolder: {base} is not a folder; set data.root to a folder with one "
                        "sub-folder of images per class (or train/ and val/ holding those)")
    tf = T.Compose([T.Resize((image_size, image_size)), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    split = (base / "train").is_dir()
    try:
        train = tvd.ImageFolder(str(base / "train" if split else base), transform=tf)
        val = tvd.ImageFolder(str(base / "val"), transform=tf) if split and (base / "val").is_dir() else None
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"imagefolder {base}: {exc}; each class needs its own sub-folder of images") from None
    if val is not None and val.classes != train.classes:
        raise DataError(f"imagefolder {base}: train/ and val/ have different class folders "
                        f"({train.classes} vs {val.classes}); give both the same classes")
    return train, val, DataInfo(3, len(train.classes), image_size, f"imagefolder:{base}")


# ----------------------------------------------------------------------------- user callable


def _load_callable(path: str, kind: str, error: type[Exception]):
    """Import `package.module:callable`; shared with engine.models."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise error(f"{kind} {path!r}: cannot import {module_name}: {type(exc).__name__}: {exc} "
                    "(is the package installed or on PYTHONPATH?)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise error(f"{kind} {path!r}: {module_name} has no callable named {attr!r}")
    return fn


def _infer_info(path: str, train: Dataset, given: dict) -> DataInfo:
    """Fill what the callable did not say from the first sample and the labels it exposes."""
    info = dict(given)
    if "in_channels" not in info or "image_size" not in info:
        try:
            x = train[0][0]
        except Exception as exc:
            raise DataError(f"data.dataset {path!r}: reading train[0] failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise DataError(f"data.dataset {path!r}: samples must be (image tensor, label); "
                            "or return an info dict with in_channels and image_size")
        info.setdefault("in_channels", int(x.shape[0]) if x.dim() == 3 else 1)
        info.setdefault("image_size", int(x.shape[-1]))
    if "num_classes" not in info:
        if hasattr(train, "classes"):
            info["num_classes"] = len(train.classes)
        elif isinstance(train, TensorDataset):
            info["num_classes"] = int(train.tensors[-1].max()) + 1
        elif hasattr(train, "targets"):
            info["num_classes"] = int(torch.as_tensor(train.targets).max()) + 1
        else:
            raise DataError(f"data.dataset {path!r}: cannot tell the number of classes; return "
                            "(train, val, {'num_classes': N}) from the callable")
    info.setdefault("name", path)
    try:
        return DataInfo(int(info["in_channels"]), int(info["num_classes"]), int(info["image_size"]),
                        str(info["name"]))
    except (TypeError, ValueError) as exc:
        raise DataError(f"data.dataset {path!r}: bad info dict {given!r}: {exc}") from None


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


def build_datasets(cfg) -> tuple[Dataset, Dataset | None, DataInfo]:
    """The train set, the val set (None when there is no val split) and what the model needs.

    A user callable `package.module:callable` is called as callable(cfg) and returns
    (train, val) or (train, val, {"in_channels", "num_classes", "image_size", "name"});
    missing info keys are read from train[0] and the data set's classes/targets.
    """
    d = cfg.data
    name = d.dataset
    if name == "synthetic":
        train, val = synthetic(d.train_size, d.val_size, d.num_classes, d.image_size)
        return train, val, DataInfo(3, d.num_classes, d.image_size, "synthetic")
    if name in _TV:
        return _torchvision_set(name, d.root, d.download)
    if name == "imagefolder":
        return _image_folder(d.root, d.image_size)
    if ":" in name:
        return _user_set(name, cfg)
    raise DataError(f"data.dataset: unknown data set {name!r}; use synthetic, cifar10, mnist, "
                    "fashionmnist, imagefolder or package.module:callable")
