"""The text data set (`data.dataset: text`): the bytes of a text file or of a folder's .txt files
as tokens (vocabulary 256), for the gpt model's language-model workload.

The last 10 % of the bytes is the validation split. A sample is a window of block_size + 1 bytes
(model.block_size, or model.kwargs' block_size): {"input_ids": the first block_size, "labels":
the last block_size}, i.e. each position's next byte. Training windows start at offsets drawn
once from a fixed seed (every rank and every run draws the same ones; the sampler shuffles
them per epoch), one window per block_size bytes of the split; validation windows are strided,
end to end, so val loss is over the whole split.

With `data.root` empty the built-in corpus is used: English-like prose generated from a small
grammar with a fixed seed (DEFAULT_BYTES = 1 MiB in ~0.05 s, the same in every process; nothing is
downloaded or shipped). Its sentences are drawn at random, so a model cannot learn it by heart:
train and val are different draws of the same language, and val loss only falls as far as the
model learns the spelling, the word order and which words go together.
"""
from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

from .errors import DataError

VOCAB_SIZE = 256  # bytes
VAL_FRACTION = 0.1
OFFSETS_SEED = 20241126  # training windows' offsets: fixed, so every rank holds the same set
CORPUS_SEED = 1859
DEFAULT_BYTES = 1 << 20
BUILTIN_NAME = "text:builtin"


class TextWindows:
    """Windows of block_size + 1 bytes of one split, as {"input_ids", "labels"} int64 tensors (a
    map-style data set for the DataLoader; torch is imported where it is used, so that the
    supervisor and `torchdeck validate` can count the windows without it)."""

    in_memory = True  # a batch is one gather from a tensor: data.num_workers -1 starts no loader process

    def __init__(self, data, block_size: int, offsets):
        import torch

        self.data, self.block_size, self.offsets = data, block_size, offsets
        self._span = torch.arange(block_size + 1)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        o = int(self.offsets[i])
        chunk = self.data[o:o + self.block_size + 1].long()
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}

    def __getitems__(self, indices):
        """A whole batch in one gather (the DataLoader's default collate then stacks the rows)."""
        import torch

        rows = self.data[self.offsets[torch.as_tensor(indices)].unsqueeze(1) + self._span].long()
        return [{"input_ids": r[:-1], "labels": r[1:]} for r in rows]


def block_size_of(cfg) -> int:
    return int((cfg.model.kwargs or {}).get("block_size") or cfg.model.block_size)


def read_root(root: str) -> tuple[bytes, str]:
    """The bytes of data.root (a file, or a folder's .txt files in sorted path order, each followed
    by a newline) and the set's name; the built-in corpus when root is empty."""
    if not root:
        return default_corpus(), BUILTIN_NAME
    path = Path(root).expanduser()
    hint = "set data.root to a text file or a folder of .txt files, or to \"\" for the built-in corpus"
    if path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataError(f"text {path}: cannot read it ({exc.strerror}); {hint}") from None
    elif path.is_dir():
        files = _txt_files(path)
        try:
            raw = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in files)
        except OSError as exc:
            raise DataError(f"text {path}: cannot read {exc.filename} ({exc.strerror}); {hint}") from None
        if not files:
            raise DataError(f"text {path}: no .txt file in this folder; {hint}")
    else:
        raise DataError(f"text {path}: no such file or folder; {hint}")
    return raw, f"text:{path}"


def _txt_files(folder: Path) -> list[Path]:
    """A folder's text: its .txt files, searched recursively, in sorted path order."""
    return sorted(p for p in folder.rglob("*.txt") if p.is_file())


def root_size(root: str) -> int | None:
    """How many bytes read_root gives for data.root, from the files' sizes and their last bytes
    (the text is not read); None when it cannot tell (read_root then says why)."""
    if not root:
        return DEFAULT_BYTES
    path = Path(root).expanduser()
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            files = _txt_files(path)
            return sum(_stripped_size(p) + 1 for p in files) if files else None
    except OSError:
        return None
    return None


def _stripped_size(path: Path) -> int:
    """The file's size without its trailing newlines (what read_root keeps of it, less its "\n")."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        end = size
        while end > 0:
            back = min(end, 4096)
            fh.seek(end - back)
            tail = fh.read(back)
            kept = len(tail.rstrip(b"\n"))
            end -= back - kept
            if kept:
                break
    return end


def train_windows(n_bytes: int, block_size: int) -> int:
    """Training samples of a text of n_bytes: one window per block_size bytes of the train split."""
    return max(1, (n_bytes - int(n_bytes * VAL_FRACTION)) // block_size)


def split(raw: bytes, block_size: int, name: str):
    """(train bytes, val bytes) as uint8 tensors: the last VAL_FRACTION is val; both must hold a window."""
    import torch

    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    n_val = int(len(data) * VAL_FRACTION)
    need = int((block_size + 1) / VAL_FRACTION) + 1
    if n_val < block_size + 1 or len(data) - n_val < block_size + 1:
        raise DataError(f"{name}: {len(data)} bytes is too little text for samples of {block_size + 1} bytes "
                        f"and a {VAL_FRACTION:.0%} validation split; give at least {need} bytes or lower "
                        "model.block_size")
    return data[:-n_val], data[-n_val:]


def text_datasets(root: str, block_size: int):
    """(train, val, info fields) of the text set: windows over each split of data.root's bytes."""
    import torch

    raw, name = read_root(root)
    train, val = split(raw, block_size, name)
    last = len(train) - block_size - 1  # the last offset a window fits at
    gen = torch.Generator().manual_seed(OFFSETS_SEED)
    offsets = torch.randint(0, last + 1, (train_windows(len(raw), block_size),), generator=gen)
    val_offsets = torch.arange(0, len(val) - block_size, block_size)
    info = {"name": name, "vocab_size": VOCAB_SIZE, "block_size": block_size}
    return TextWindows(train, block_size, offsets), TextWindows(val, block_size, val_offsets), info


# ----------------------------------------------------------------------------- the built-in corpus

_NAMES = ("Ada", "Bram", "Cora", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira",
          "Lars", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tove", "Umar", "Vera", "Wim")
_NOUNS = ("river", "garden", "lantern", "letter", "window", "mountain", "harbour", "engine", "kettle",
          "market", "forest", "bridge", "candle", "village", "teacher", "sailor", "miller", "painter",
          "horse", "raven", "clock", "violin", "orchard", "meadow", "station", "library", "captain",
          "stranger", "wagon", "storm", "island", "cellar", "chimney", "shepherd", "fisherman", "tower")
_ADJS = ("old", "quiet", "bright", "narrow", "heavy", "silver", "patient", "crooked", "golden", "distant",
         "small", "restless", "gentle", "broken", "hidden", "green", "careful", "wooden", "cold", "proud")
# (base, third person, past)
_VERBS = (("watch", "watches", "watched"), ("carry", "carries", "carried"), ("follow", "follows", "followed"),
          ("remember", "remembers", "remembered"), ("find", "finds", "found"), ("mend", "mends", "mended"),
          ("paint", "paints", "painted"), ("leave", "leaves", "left"), ("open", "opens", "opened"),
          ("guard", "guards", "guarded"), ("sell", "sells", "sold"), ("count", "counts", "counted"),
          ("build", "builds", "built"), ("forget", "forgets", "forgot"), ("hear", "hears", "heard"),
          ("visit", "visits", "visited"), ("hide", "hides", "hid"), ("greet", "greets", "greeted"))
_ADVS = ("slowly", "quietly", "again", "at dawn", "every evening", "before the rain", "without a word",
         "in the morning", "once more", "at last", "by lamplight", "after supper")
_PREPS = ("near", "behind", "beyond", "under", "across", "beside", "above", "past")
_SAYS = ("said", "asked", "whispered", "answered", "called")
_CONJ = ("because", "while", "although", "after", "before", "until")
_NUMS = ("two", "three", "four", "five", "seven", "ten", "twelve", "a hundred")


def _np(r: random.Random, det: bool = True) -> str:
    """A noun phrase: [the|a] [adjective] noun [of the noun]."""
    words = [r.choice(("the", "the", "a")) if det else "the"]
    if r.random() < 0.5:
        words.append(r.choice(_ADJS))
    words.append(r.choice(_NOUNS))
    if r.random() < 0.15:
        words += ["of", "the", r.choice(_NOUNS)]
    out = " ".join(words)
    return "an " + out[2:] if out.startswith("a ") and out[2] in "aeiou" else out


def _subject(r: random.Random) -> str:
    return r.choice(_NAMES) if r.random() < 0.35 else _np(r)


def _clause(r: random.Random, past: bool) -> str:
    subj = _subject(r)
    verb = r.choice(_VERBS)[2 if past else 1]
    parts = [subj, verb, _np(r)]
    if r.random() < 0.4:
        parts += [r.choice(_PREPS), _np(r, det=False)]
    if r.random() < 0.3:
        parts.append(r.choice(_ADVS))
    return " ".join(parts)


def _sentence(r: random.Random, past: bool) -> str:
    kind = r.random()
    if kind < 0.55:
        s = _clause(r, past)
        if r.random() < 0.3:
            s += f" {r.choice(_CONJ)} {_clause(r, past)}"
        s += "."
    elif kind < 0.7:
        s = f"{r.choice(_NUMS)} {r.choice(_ADJS)} {r.choice(_NOUNS)}s stood {r.choice(_PREPS)} {_np(r, det=False)}."
    elif kind < 0.85:
        who = r.choice(_NAMES)
        if r.random() < 0.3:
            return f"\"Did you {r.choice(_VERBS)[0]} {_np(r)}?\" {who} asked."
        said = _clause(r, False)
        return f"\"{said[0].upper()}{said[1:]},\" {who} {r.choice(_SAYS)}."
    else:
        s = f"there was {_np(r)} {r.choice(_PREPS)} {_np(r, det=False)}, and {_clause(r, past)}."
    return s[0].upper() + s[1:]


@lru_cache(maxsize=2)
def default_corpus(size: int = DEFAULT_BYTES) -> bytes:
    """The built-in corpus: `size` bytes of generated prose, the same in every process (a seeded
    random.Random, whose choices Python keeps stable across versions), paragraphs of 3-7
    sentences, each paragraph in the past or the present tense."""
    r = random.Random(CORPUS_SEED)
    out, n = [], 0
    while n < size:
        past = r.random() < 0.5
        para = " ".join(_sentence(r, past) for _ in range(r.randint(3, 7))) + "\n\n"
        out.append(para)
        n += len(para)
    return "".join(out).encode("ascii")[:size]
