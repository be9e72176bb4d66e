"""A folder of PNGs as a user's own data set looks: train/ and val/, one sub-folder per class.

The pictures are the built-in synthetic set scaled to 0-255 (learnable, so validation accuracy
means something), written once per size and reused:

    python -m bench.imagefolder_data DIR [--train 2000] [--val 500] [--size 32]
"""
from __future__ import annotations

import argparse
from pathlib import Path


def make_folder(root: Path, train: int = 2000, val: int = 500, size: int = 32, classes: int = 10) -> Path:
    """root/train/<class>/<i>.png and root/val/<class>/<i>.png; kept when already complete."""
    import numpy as np
    from PIL import Image

    from torchdeck.engine.data import synthetic

    done = root / ".complete"
    if done.exists():
        return root
    tr, va = synthetic(train, val, classes, size)
    lo, hi = -2.5, 2.5  # the set is normalized: +-2.5 std covers nearly every pixel
    for split, ds in (("train", tr), ("val", va)):
        x, y = ds.tensors
        pix = ((x.clamp(lo, hi) - lo) * (255 / (hi - lo))).round().to(dtype=__import__("torch").uint8)
        arr = pix.permute(0, 2, 3, 1).numpy()
        for c in range(classes):
            (root / split / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
        for i, (img, label) in enumerate(zip(arr, y.tolist())):
            Image.fromarray(np.ascontiguousarray(img)).save(root / split / f"class{label:02d}" / f"{i:05d}.png")
    done.touch()
    return root


_SHARED: dict[tuple, Path] = {}


def shared_folder(train: int, val: int, size: int = 32) -> Path:
    """One folder per size for this process: imagefolder_vs_plain and loader_start read the same
    pictures, written once (in a --quick run they are the same size)."""
    key = (train, val, size)
    if key not in _SHARED:
        from bench import common as C

        _SHARED[key] = make_folder(C.tmpdir("imagefolder-data") / "pngs", train, val, size)
    return _SHARED[key]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--val", type=int, default=500)
    ap.add_argument("--size", type=int, default=32)
    a = ap.parse_args(argv)
    print(make_folder(Path(a.dir), a.train, a.val, a.size))


if __name__ == "__main__":
    main()
