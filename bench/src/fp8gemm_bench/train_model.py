"""What the training runs train: a byte-level Llama-style decoder in plain torch modules, the bytes of the Python
standard library's source as its text, the batches drawn from a seed, and AdamW with float32 master weights.

Every projection of the decoder is a plain ``nn.Linear`` (q, k and v fused into ``qkv``, gate and up into
``gate_up``) with N and K multiples of 128 wherever the sizes are, so ``fp8gemm.nn.convert(model, training=True)``
converts all of them but ``lm_head`` (kept by its default ``skip``). Attention is torch's ``scaled_dot_product_attention``
(causal), normalization RMSNorm, positions rotary; no bias anywhere.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256  # bytes
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}  # installed packages are not the standard library


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 1024
    layers: int = 8
    heads: int = 8
    kv_heads: int = 8
    intermediate: int = 2816
    vocab: int = VOCAB
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        """The parameter count of ``ByteLlama(self)``."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * (per_layer + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def as_dict(self) -> dict:
        return {**asdict(self), "head_dim": self.head_dim, "parameters": self.parameters()}


# The convergence run's model: 103M parameters, every projection a multiple of 128.
CONVERGENCE = ModelConfig()
# Llama-3-8B's layer (hidden 4096, intermediate 14336, 32 heads, 8 kv heads), 8 of them, on bytes.
LLAMA3_8B_8_LAYERS = ModelConfig(hidden=4096, layers=8, heads=32, kv_heads=8, intermediate=14336, rope_theta=500000.0)
SMOKE = ModelConfig(hidden=256, layers=2, heads=2, kv_heads=1, intermediate=512)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by position (the halves rotated, as Llama's ``rotate_half``)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.qkv = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * d, bias=False)
        self.o = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, t, _) = self.cfg, h.shape
        d = cfg.head_dim
        q, k, v = self.qkv(self.attn_norm(h)).split([cfg.heads * d, cfg.kv_heads * d, cfg.kv_heads * d], dim=-1)
        q = rotary(q.view(b, t, cfg.heads, d).transpose(1, 2), cos, sin)
        k = rotary(k.view(b, t, cfg.kv_heads, d).transpose(1, 2), cos, sin)
        v = v.view(b, t, cfg.kv_heads, d).transpose(1, 2)
        if cfg.kv_heads != cfg.heads:
            k = k.repeat_interleave(cfg.heads // cfg.kv_heads, dim=1)
            v = v.repeat_interleave(cfg.heads // cfg.kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(a.transpose(1, 2).reshape(b, t, cfg.heads * d))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class ByteLlama(nn.Module):
    """A Llama-style decoder on bytes: ``forward(tokens [B, T] int64) -> logits [B, T, 256]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            # the projections into the residual stream scaled down by depth (GPT-2's)
            scale = 1 / math.sqrt(2 * self.cfg.layers) if name.endswith(("o.weight", "down.weight")) else 1.0
            nn.init.normal_(p, std=std * scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        d = self.cfg.head_dim
        inv = 1.0 / self.cfg.rope_theta ** (torch.arange(0, d, 2, device=tokens.device, dtype=torch.float32) / d)
        angles = torch.arange(t, device=tokens.device, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = angles.cos(), angles.sin()
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, cos, sin)
        return self.lm_head(self.norm(h))


def build_model(cfg: ModelConfig, seed: int, device, dtype=torch.bfloat16, on_device: bool = False) -> ByteLlama:
    """The model with weights drawn from ``seed`` on the CPU (the same weights on every device), then moved; with
    ``on_device``, drawn on ``device`` itself (faster for a large model; the same weights on one kind of device)."""
    device = torch.device(device)
    on_device = on_device and device.type != "cpu"
    with torch.random.fork_rng(devices=[device] if on_device else []):
        torch.manual_seed(seed)
        with torch.device(device if on_device else "cpu"):
            model = ByteLlama(cfg)
    return model.to(device=device, dtype=dtype)


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The ``.py`` files under the standard library's directory (``sysconfig.get_paths()['stdlib']``), sorted by
    their path relative to it; installed packages (site-packages, dist-packages) left out, links not followed."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]
        found += [Path(folder, f) for f in files if f.endswith(".py") and not Path(folder, f).is_symlink()]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def stdlib_corpus(root: str | Path | None = None, limit_bytes: int | None = None) -> tuple[bytes, dict]:
    """The files of ``stdlib_files`` concatenated in their order (the first ``limit_bytes`` if given), and what it is:
    its root, file count, size and sha256, and the Python it came from."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    parts, size, used = [], 0, 0
    for path in stdlib_files(root):
        data = path.read_bytes()
        parts.append(data)
        size += len(data)
        used += 1
        if limit_bytes is not None and size >= limit_bytes:
            break
    data = b"".join(parts)[:limit_bytes]
    if not data:
        raise ValueError(f"no .py files under {root}: the standard library's source is needed as the text")
    info = {"root": str(root), "files": used, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "python": sysconfig.get_python_version()}  # fmt: skip
    return data, info


def split_corpus(data: bytes, held_out: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 tensors: the text without its last ``held_out`` share (training), and that share (evaluation)."""
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    cut = int(len(tokens) * (1 - held_out))
    return tokens[:cut], tokens[cut:]


class Batches:
    """Windows of ``seq + 1`` bytes at offsets drawn from ``seed``: inputs and next-byte targets, [batch, seq] int64.
    Two samplers of one seed on one text give the same batches in the same order."""

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, seed: int, device):
        if len(tokens) <= seq + 1:
            raise ValueError(f"the text has {len(tokens)} bytes, fewer than one window of {seq + 1}")
        self.tokens, self.batch, self.seq, self.device = tokens, batch, seq, device
        self.gen = torch.Generator().manual_seed(seed)
        self.window = torch.arange(seq + 1)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (self.batch,), generator=self.gen)
        w = self.tokens[starts[:, None] + self.window].long().to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    def __iter__(self):
        return self


def loss_fn(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class MasterAdamW:
    """AdamW on float32 copies of the model's (bf16) Parameters: each step casts the gradients up, clips their norm,
    steps and writes the weights back rounded to the model's dtype. ``master_dtype=None``: AdamW on the Parameters
    themselves (bf16 weights and states: the least memory). Weight decay on matrices only; torch's fused AdamW kernel on
    a GPU (its foreach one elsewhere)."""

    def __init__(self, model: nn.Module, lr: float, betas=(0.9, 0.95), weight_decay: float = 0.1,
                 master_dtype: torch.dtype | None = torch.float32, clip: float | None = 1.0):  # fmt: skip
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = (
            [p.detach().to(master_dtype).clone() for p in self.params] if master_dtype is not None else self.params
        )
        decay = [m for m, p in zip(self.master, self.params, strict=True) if p.dim() >= 2]
        rest = [m for m, p in zip(self.master, self.params, strict=True) if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
        fused = all(m.is_cuda for m in self.master)  # one kernel per step, as training frameworks run it on a GPU
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None, foreach=not fused)
        self.clip = clip

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        if self.master is not self.params:
            for m, p in zip(self.master, self.params, strict=True):
                m.grad = None if p.grad is None else p.grad.to(m.dtype)
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.master, self.clip, foreach=True)
        self.opt.step()
        if self.master is not self.params:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.master is not self.params:
            for m in self.master:
                m.grad = None


def lr_at(step: int, steps: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine down to ``floor`` x peak at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    done = (step - warmup) / max(1, steps - warmup - 1)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))
