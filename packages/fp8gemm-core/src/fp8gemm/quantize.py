"""Quantizers producing the contract's inputs (plain torch: CPU and GPU)."""

from __future__ import annotations

import torch

from .reference import BLOCK, FP8_DTYPES

# A block of all zeros would give scale 0 and 0/0 on dequantisation; this floor keeps it finite.
_AMAX_FLOOR = 1e-12


def _check_fp8_dtype(fp8_dtype: torch.dtype) -> float:
    if not isinstance(fp8_dtype, torch.dtype):
        raise TypeError(f"fp8_dtype must be a torch.dtype, got {fp8_dtype!r}")
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    return torch.finfo(fp8_dtype).max


def _scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool) -> torch.Tensor:
    scale = amax.float().clamp_min(_AMAX_FLOOR) / fp8_max
    if pow2:  # UE8M0 scales (DeepSeek-V3.1 recipe): round up so |x / scale| stays <= fp8_max
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return scale


def _check_source(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype in FP8_DTYPES:
        raise TypeError(f"{name} must be a float16/bfloat16/float32 tensor, got {x.dtype}")
    if x.shape[-1] % BLOCK:
        raise ValueError(f"{name}'s last dim (K = {x.shape[-1]}) must be a multiple of {BLOCK}; pad it with zeros")


def _backend_defaults(device: torch.device, backend: str | None):
    """FP8 dtype and activation-scale layout of the backend that would run on ``device``."""
    from .registry import select  # late: the registry imports the reference, not the quantizers

    try:
        chosen = select(device, backend).backend
    except RuntimeError:  # no backend for this GPU: plain defaults; gemm() will say what is missing
        return torch.float8_e4m3fn, None
    layout = getattr(chosen, "a_scale_layout", None)
    return (getattr(torch, chosen.fp8_dtype) if chosen.fp8_dtype else torch.float8_e4m3fn), layout


def quantize_activation(
    x: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] float -> (FP8 [M, K], fp32 scales [M, K/128]), one scale per token per 128 of K.

    Leading dims are flattened into M. ``pow2_scales`` rounds each scale up to a power of two.
    ``fp8_dtype`` defaults to what the backend for ``x``'s device takes (e4m3fn on CPU), and the
    scales come in that backend's memory layout, so ``gemm`` needs no per-call conversion.
    """
    _check_source("x", x)
    default_dtype, layout = _backend_defaults(x.device, backend)
    fp8_dtype = fp8_dtype or default_dtype
    fp8_max = _check_fp8_dtype(fp8_dtype)
    k = x.shape[-1]
    groups = x.reshape(-1, k // BLOCK, BLOCK).float()
    scale = _scale_from_amax(groups.abs().amax(dim=-1), fp8_max, pow2_scales)
    q = (groups / scale[..., None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    if layout is not None:
        from .validation import conform_scale

        scale = conform_scale(scale, layout)[0]
    return q.reshape(-1, k), scale


def quantize_weight(
    w: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (FP8 [N, K], fp32 scales [ceil(N/128), K/128]), one scale per 128x128 block.

    N need not be a multiple of 128: the last row block is padded internally and not returned.
    ``fp8_dtype`` defaults to what the backend for ``w``'s device takes. For the scale layout the
    kernel reads, pass the result through ``prepare_weight_scale`` once.
    """
    _check_source("w", w)
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    fp8_dtype = fp8_dtype or _backend_defaults(w.device, None)[0]
    fp8_max = _check_fp8_dtype(fp8_dtype)
    n, k = w.shape
    n_pad = -(-n // BLOCK) * BLOCK
    padded = torch.nn.functional.pad(w.float(), (0, 0, 0, n_pad - n))
    blocks = padded.reshape(n_pad // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = _scale_from_amax(blocks.abs().amax(dim=(1, 3)), fp8_max, pow2_scales)
    q = (blocks / scale[:, None, :, None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(n_pad, k)[:n].contiguous(), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of either quantizer, to fp32 (for checks and debugging)."""
    rows = q.shape[0]
    row_block = BLOCK if scale.shape[0] != rows else 1
    s = scale.repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)
    return q.float() * s
