"""Models a run can train: the CIFAR-tutorial CNN, ResNet-18, an MLP, a small GPT, or a user callable.

Built after the worker seeds torch, so the weights are the same on every rank and every run.
No batch norm or dropout in cnn and mlp: the equivalence tests (DDP vs one process) rely on it.
cnn and mlp are nn.Sequential so a model-parallel split can cut them between layers.
gpt is a decoder-only language model (nanoGPT's shape) that returns its own loss, HF-style.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import CNN_MIN_IMAGE
from .data import DataInfo, _load_callable
from .errors import TorchdeckError


class ModelError(TorchdeckError):
    """A model that cannot be built for this data, with what to change."""


def cnn(info: DataInfo) -> nn.Sequential:
    """The PyTorch CIFAR-10 tutorial network, sized for any channel count and image size."""
    side = ((info.image_size - 4) // 2 - 4) // 2
    if side < 1:  # a dataset whose own size is small (config refuses a small data.image_size before)
        raise ModelError(f"model cnn needs images of at least {CNN_MIN_IMAGE} px, got {info.image_size}; "
                         "use model mlp or resnet18")
    return nn.Sequential(
        nn.Conv2d(info.in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side * side, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, info.num_classes),
    )


def mlp(info: DataInfo, hidden: int = 256) -> nn.Sequential:
    flat = info.in_channels * info.image_size * info.image_size
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(flat, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, info.num_classes),
    )


def resnet18(info: DataInfo, small_stem: bool = True) -> nn.Module:
    """torchvision's ResNet-18; the small stem keeps 32x32 images from shrinking to 1x1 too early."""
    from torchvision.models import resnet18 as tv_resnet18

    model = tv_resnet18(weights=None, num_classes=info.num_classes)
    if small_stem:
        model.conv1 = nn.Conv2d(info.in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif info.in_channels != 3:
        model.conv1 = nn.Conv2d(info.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


# ----------------------------------------------------------------------------- gpt


class LMOutput(dict):
    """What GPT.forward returns: a dict ("logits", and "loss" when labels were given) whose keys
    also read as attributes (out.loss), as a HuggingFace ModelOutput does."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class _SelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, head dim)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = _SelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=False), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT-style decoder: token + learned position embeddings, n_layer pre-LN blocks of
    causal self-attention and a GELU MLP, a final LayerNorm and a head tied to the token embedding.

    forward(input_ids (B, T) int64, labels (B, T) or None) -> LMOutput(logits (B, T, vocab)[, loss]):
    the loss is the mean cross-entropy over every position (labels are the inputs shifted by one,
    as the text data set gives them; -100 is ignored, as in HuggingFace)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 4, n_head: int = 4, n_embd: int = 128):
        super().__init__()
        if n_embd % n_head:
            raise ModelError(f"model gpt: n_embd {n_embd} must be a multiple of n_head {n_head}")
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(_Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init)
        for block in self.blocks:  # residual projections scaled down with depth (GPT-2's init)
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layer))
        # Counted here, while every parameter is whole (FSDP and ZeRO-3 shard them later).
        self._flops_per_token = self._count_flops()

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def _count_flops(self) -> int:
        """nanoGPT's estimate (PaLM, appendix B): 6 N + 12 L H Q T per token trained (forward and
        backward), N the parameters without the position embedding (the token embedding counts:
        it is the head's matmul), Q the head size, T the context length."""
        n = sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()
        return 6 * n + 12 * self.n_layer * self.n_head * (self.n_embd // self.n_head) * self.block_size

    def flops_per_token(self) -> int:
        """Model FLOPs per token of a training step (for MFU)."""
        return self._flops_per_token

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        t = input_ids.shape[1]
        if t > self.block_size:
            raise ValueError(f"model gpt: a sequence of {t} tokens is longer than block_size {self.block_size}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        out = LMOutput(logits=logits)
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                          ignore_index=-100)
        return out


def gpt(info: DataInfo, m) -> GPT:
    """The GPT sized by model.n_layer/n_head/n_embd/block_size (model.kwargs of the same names win),
    its vocabulary from the data (the text set: 256 byte values)."""
    kw = dict(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, block_size=m.block_size)
    unknown = sorted(set(m.kwargs or {}) - set(kw) - {"vocab_size"})
    if unknown:
        raise ModelError(f"model.kwargs: gpt takes n_layer, n_head, n_embd, block_size, vocab_size; "
                         f"not {', '.join(unknown)}")
    kw.update(m.kwargs or {})
    vocab = kw.pop("vocab_size", None) or getattr(info, "vocab_size", None)
    if not vocab:
        raise ModelError(f"model gpt needs token data ({info.name} has no vocabulary): use data.dataset text, "
                         "or a data callable whose info says vocab_size")
    block = getattr(info, "block_size", None)
    if block and block > kw["block_size"]:
        raise ModelError(f"model gpt: the data's samples are {block} tokens, longer than model.block_size "
                         f"{kw['block_size']}")
    return GPT(int(vocab), **{k: int(v) for k, v in kw.items()})


# ----------------------------------------------------------------------------- MFU

# Peak dense bf16 tensor FLOP/s per GPU, from the vendor's data sheets (without sparsity), by a
# part of the name torch.cuda.get_device_name gives; the first match wins, so the longer names
# come first. A GPU not listed gets no MFU rather than a guessed one.
PEAK_BF16_FLOPS = (
    ("gh200", 989e12),
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),  # SXM (HBM3)
    ("b200", 2250e12),
    ("a100", 312e12),
    ("l40s", 362e12),
    ("l4", 121e12),
)


def peak_flops(device_name: str | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s, or None for a GPU (or CPU) the table does not know."""
    name = (device_name or "").lower()
    for part, flops in PEAK_BF16_FLOPS:
        if part in name:
            return flops
    return None


def mfu(flops_per_token: float | None, tokens_per_s: float | None, device_name: str | None) -> float | None:
    """Model FLOPs utilization of one device: the model's FLOPs per token times the tokens it
    trains per second, over the device's peak; None when any of the three is unknown."""
    peak = peak_flops(device_name)
    if not peak or not flops_per_token or not tokens_per_s:
        return None
    return flops_per_token * tokens_per_s / peak


def mfu_meter(model, compiled: bool, device):
    """What turns a rank's tokens/s into its MFU for step events, or None where none is reported:
    only a compiled model (train.compile) on a GPU the peak table knows, whose model says its FLOPs
    per token (gpt does). Call it with the unwrapped model, before a strategy shards it."""
    if not compiled or getattr(device, "type", "cpu") != "cuda":
        return None
    flops = model_flops_per_token(model)
    name = torch.cuda.get_device_name(device)
    if flops is None or peak_flops(name) is None:
        return None
    return lambda tokens_per_s: mfu(flops, tokens_per_s, name)


def model_flops_per_token(model) -> int | None:
    """flops_per_token() of a model (GPT, or a user's model that has the method), looking inside
    the wrappers a strategy or torch.compile puts around it; None when it has none."""
    for _ in range(4):
        fn = getattr(model, "flops_per_token", None)
        if callable(fn):
            try:
                return int(fn())
            except Exception:  # noqa: BLE001 - a user's method must not stop training
                return None
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return None
        model = inner
    return None


def build_model(cfg, info: DataInfo) -> torch.nn.Module:
    """The model named by cfg.model.name; a user callable is called as callable(info, **cfg.model.kwargs)."""
    m = cfg.model
    if m.name == "cnn":
        return cnn(info)
    if m.name == "mlp":
        return mlp(info, m.hidden)
    if m.name == "resnet18":
        return resnet18(info, m.small_stem)
    if m.name == "gpt":
        return gpt(info, m)
    if ":" in m.name:
        fn = _load_callable(m.name, "model.name", ModelError)
        try:
            model = fn(info, **(m.kwargs or {}))
        except Exception as exc:
            raise ModelError(f"model.name {m.name!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise ModelError(f"model.name {m.name!r} must return a torch.nn.Module, got {type(model).__name__}")
        return model
    raise ModelError(f"model.name: unknown model {m.name!r}; use cnn, resnet18, mlp, gpt or package.module:callable")
