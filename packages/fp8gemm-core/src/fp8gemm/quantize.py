"""Quantizers producing the contract's inputs.

``quantize_activation`` runs the backend's one-launch kernel where the device has one (bit-identical
to ``reference.reference_quantize``, which runs everywhere else); ``quantize_weight`` is plain torch.
Numerics, tie and NaN rules: docs/quantization.md.
"""

from __future__ import annotations

import torch

from . import runtime
from .autograd import refuse_grad
from .launch import run_quantize
from .native import reraise_unless_miss
from .plans import plan_quantize
from .reference import BLOCK, reciprocal, scale_from_amax
from .registry import backend_defaults
from .runtime import LIBRARY, empty_scale
from .validation import check_fp8_dtype, check_source


@runtime.op("quantize_activation", "quantize_activation", ("x",))
def _quantize_op(x: torch.Tensor, fp8_dtype: torch.dtype | None, pow2_scales: bool,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return eager_quantize(x, fp8_dtype, pow2_scales, backend or None)


@_quantize_op.register_fake
def _(x, fp8_dtype, pow2_scales, backend):
    check_source("x", x)
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
    refuse_grad("quantize_activation", ("x",), (x,))  # traced as a guard under torch.compile
    if torch.compiler.is_compiling():
        return _ops.quantize_activation(x, fp8_dtype, pow2_scales, backend or "")
    return eager_quantize(x, fp8_dtype, pow2_scales, backend)


def eager_quantize(x, fp8_dtype, pow2_scales: bool, backend: str | None):
    """One call (also the compiled op's body): the backend's native op where it takes it, else the planned call."""
    native = runtime.native_ops(x, x, backend)
    if native is not None and fp8_dtype is None:  # the backend's dtype, which the native op writes
        try:
            return native.quantize_activation(x, pow2_scales)
        except RuntimeError as error:
            reraise_unless_miss(error)
    return run_quantize(plan_quantize(x, fp8_dtype, backend), x, pow2_scales)


def quantize_weight(
    w: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (FP8 [N, K], fp32 scales [ceil(N/128), K/128]), one scale per 128x128 block.

    N need not be a multiple of 128: the last row block is padded internally and not returned.
    ``fp8_dtype`` defaults to what the backend for ``w``'s device takes. For the scale layout the
    kernel reads, pass the result through ``prepare_weight_scale`` once.
    """
    check_source("w", w)
    refuse_grad("quantize_weight", ("w",), (w,))
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    fp8_dtype = fp8_dtype or backend_defaults(w.device, None)[1]
    fp8_max = check_fp8_dtype(fp8_dtype)
    n, k = w.shape
    n_pad = -(-n // BLOCK) * BLOCK
    padded = torch.nn.functional.pad(w.float(), (0, 0, 0, n_pad - n))
    blocks = padded.reshape(n_pad // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = scale_from_amax(blocks.abs().amax(dim=(1, 3)), fp8_max, pow2_scales)
    q = (blocks * reciprocal(scale)[:, None, :, None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(n_pad, k)[:n].contiguous(), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of either quantizer, to fp32 (for checks and debugging)."""
    rows = q.shape[0]
    row_block = BLOCK if scale.shape[0] != rows else 1
    s = scale.repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)
    return q.float() * s
