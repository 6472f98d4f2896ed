"""Quantizers producing the contract's inputs.

``quantize_activation`` runs the backend's one-launch kernel where the device has one (bit-identical
to the pure-torch reference below, which runs everywhere else); ``quantize_weight`` is plain torch.
Numerics, tie and NaN rules: docs/quantization.md.
"""

from __future__ import annotations

import torch

from . import runtime
from .protocol import K_MAJOR, QUANTIZE_ARGS, ScaleLayout
from .reference import BLOCK, FP8_DTYPES
from .runtime import IN_KINDS, LIBRARY

# The smallest normal fp32: the scale floor. Tiny blocks keep their relative precision down to
# amax = fp8_max * 2^-126, and an all-zero block gets a finite scale.
SCALE_FLOOR = torch.finfo(torch.float32).tiny


def _check_fp8_dtype(fp8_dtype: torch.dtype) -> float:
    if not isinstance(fp8_dtype, torch.dtype):
        raise TypeError(f"fp8_dtype must be a torch.dtype, got {fp8_dtype!r}")
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {', '.join(map(str, FP8_DTYPES))}, got {fp8_dtype}")
    return torch.finfo(fp8_dtype).max


def _round_up_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Each finite positive scale rounded up to a power of two, by its bits (exact, as the kernels do)."""
    bits = scale.view(torch.int32)
    exponent = bits & 0x7F800000
    up = (bits & ~0x7FFFFF) + 0x800000
    return torch.where((exponent != 0x7F800000) & ((bits & 0x7FFFFF) != 0), up, bits).view(torch.float32)


def scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool) -> torch.Tensor:
    """``max(amax / fp8_max, SCALE_FLOOR)``, NaN kept; ``pow2``: UE8M0 scales (DeepSeek-V3.1 recipe)."""
    amax = amax.float()
    scale = amax / torch.full_like(amax, fp8_max)  # a true division: torch turns "/ scalar" into a multiply on GPUs
    scale = torch.where(scale < SCALE_FLOOR, SCALE_FLOOR, scale)
    return _round_up_pow2(scale) if pow2 else scale


def _reciprocal(scale: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(scale) / scale  # correctly rounded on every device, as the kernels' 1.0f / scale


def _check_source(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in IN_KINDS:
        raise TypeError(f"{name} must be a bfloat16/float16/float32 tensor, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % BLOCK:
        k = x.shape[-1] if x.dim() else None
        raise ValueError(f"{name}'s last dim (K = {k}) must be a positive multiple of {BLOCK}; pad it with zeros")


def backend_defaults(device: torch.device, backend: str | None):
    """The backend that would run on ``device`` (None for the reference), its FP8 dtype and scale layout."""
    from .reference import REFERENCE
    from .registry import select  # late: the registry imports the reference, not the quantizers

    try:
        chosen = select(device, backend).backend
    except RuntimeError:  # no backend for this GPU: plain defaults; gemm() will say what is missing
        return None, torch.float8_e4m3fn, None
    if chosen is REFERENCE:
        return None, torch.float8_e4m3fn, None
    return chosen, getattr(torch, chosen.fp8_dtype), chosen.a_scale_layout


def empty_scale(m: int, kb: int, layout: ScaleLayout | None, device) -> tuple[torch.Tensor, int]:
    """An uninitialised fp32 [m, kb] scale tensor in ``layout`` and its leading dimension."""
    if layout is None:
        return torch.empty((m, kb), dtype=torch.float32, device=device), kb
    mult = layout.ld_multiple
    if layout.order == K_MAJOR:
        ld = -(-kb // mult) * mult
        return torch.empty_strided((m, kb), (ld, 1), dtype=torch.float32, device=device), ld
    ld = max(-(-m // mult) * mult, mult)
    return torch.empty_strided((m, kb), (1, ld), dtype=torch.float32, device=device), ld


def reference_quantize(x2d: torch.Tensor, fp8_dtype: torch.dtype, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float -> (FP8 [M, K], fp32 [M, K/128] row-major): the definition every kernel matches."""
    fp8_max = torch.finfo(fp8_dtype).max
    m, k = x2d.shape
    groups = x2d.float().contiguous().reshape(m, k // BLOCK, BLOCK)
    scale = scale_from_amax(groups.abs().amax(dim=-1), fp8_max, pow2)
    q = (groups * _reciprocal(scale)[..., None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(m, k), scale


def kernel_quantize(backend, x2d: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of ``backend.quantize`` on the current device and stream (``x2d``'s device, m >= 1)."""
    x2d = runtime.kernel_rows(x2d)
    m, k = x2d.shape
    q = torch.empty((m, k), dtype=getattr(torch, backend.fp8_dtype), device=x2d.device)
    scale, ld = empty_scale(m, k // BLOCK, backend.a_scale_layout, x2d.device)
    stream = runtime.raw_stream(x2d.device.index)
    backend.quantize(QUANTIZE_ARGS.pack(x2d.data_ptr(), q.data_ptr(), scale.data_ptr(), m, k, x2d.stride(0), ld,
                     IN_KINDS[x2d.dtype], int(pow2), stream))  # fmt: skip
    return q, scale


def quantize_rows(x, fp8_dtype, pow2_scales: bool, backend: str | None, name: str = "x"):
    """The checked ``quantize_activation``: ``x`` [..., K] -> (FP8 [M, K], scales [M, K/128]) on ``x``'s device."""
    _check_source(name, x)
    chosen, default_dtype, layout = backend_defaults(x.device, backend)
    fp8_dtype = fp8_dtype or default_dtype
    _check_fp8_dtype(fp8_dtype)
    x2d = x.reshape(-1, x.shape[-1])
    m, k = x2d.shape
    if m == 0:
        return torch.empty((0, k), dtype=fp8_dtype, device=x.device), empty_scale(0, k // BLOCK, layout, x.device)[0]
    if chosen is not None and chosen.quantize is not None and getattr(torch, chosen.fp8_dtype) is fp8_dtype:
        with runtime.on_device(x.device):
            return kernel_quantize(chosen, x2d, pow2_scales)
    q, scale = reference_quantize(x2d, fp8_dtype, pow2_scales)
    if layout is not None:
        out, _ = empty_scale(m, k // BLOCK, layout, x.device)
        scale = out.copy_(scale)
    return q, scale


@runtime.op("quantize_activation", "quantize_activation", ("x",))
def _quantize_op(x: torch.Tensor, fp8_dtype: torch.dtype | None, pow2_scales: bool,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return quantize_rows(x, fp8_dtype, pow2_scales, backend or None)


@_quantize_op.register_fake
def _(x, fp8_dtype, pow2_scales, backend):
    _check_source("x", x)
    _, default_dtype, layout = backend_defaults(x.device, backend or None)
    k = x.shape[-1]
    m = x.numel() // k
    q = x.new_empty((m, k), dtype=fp8_dtype or default_dtype)
    return q, empty_scale(m, k // BLOCK, layout, x.device)[0]


_ops = getattr(torch.ops, LIBRARY)


def quantize_activation(
    x: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] float -> (FP8 [M, K], fp32 scales [M, K/128]), one scale per token per 128 of K.

    Leading dims are flattened into M (any layout; rows with a 16-byte-aligned stride are read in
    place). ``pow2_scales`` rounds each scale up to a power of two. ``fp8_dtype`` defaults to what the
    backend for ``x``'s device takes (e4m3fn on CPU), and the scales come in that backend's memory
    layout, so ``gemm`` needs no per-call conversion. On a GPU whose backend has a quantization kernel
    this is one launch, bit-identical to the CPU result.
    """
    runtime.refuse_grad("quantize_activation", ("x",), (x,))  # traced as a guard under torch.compile
    if torch.compiler.is_compiling():
        return _ops.quantize_activation(x, fp8_dtype, pow2_scales, backend or "")
    return quantize_rows(x, fp8_dtype, pow2_scales, backend)


def quantize_weight(
    w: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (FP8 [N, K], fp32 scales [ceil(N/128), K/128]), one scale per 128x128 block.

    N need not be a multiple of 128: the last row block is padded internally and not returned.
    ``fp8_dtype`` defaults to what the backend for ``w``'s device takes. For the scale layout the
    kernel reads, pass the result through ``prepare_weight_scale`` once.
    """
    _check_source("w", w)
    runtime.refuse_grad("quantize_weight", ("w",), (w,))
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    fp8_dtype = fp8_dtype or backend_defaults(w.device, None)[1]
    fp8_max = _check_fp8_dtype(fp8_dtype)
    n, k = w.shape
    n_pad = -(-n // BLOCK) * BLOCK
    padded = torch.nn.functional.pad(w.float(), (0, 0, 0, n_pad - n))
    blocks = padded.reshape(n_pad // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = scale_from_amax(blocks.abs().amax(dim=(1, 3)), fp8_max, pow2_scales)
    q = (blocks * _reciprocal(scale)[:, None, :, None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(n_pad, k)[:n].contiguous(), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of either quantizer, to fp32 (for checks and debugging)."""
    rows = q.shape[0]
    row_block = BLOCK if scale.shape[0] != rows else 1
    s = scale.repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)
    return q.float() * s
