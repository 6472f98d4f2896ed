"""Quantizers for training: each operand in FP8 together with its transpose, as the backward GEMMs read them.

``quantize_with_transpose`` gives an activation (or output gradient) x [M, K] with 1x128 scales along K, exactly
``fp8gemm.quantize_activation``'s, and x^T [K, M_pad] with 1x128 scales along M (the operand of the weight-gradient
GEMM, which contracts over tokens). ``quantize_weight_with_transpose`` gives ``quantize_weight``'s W and W^T, whose
128x128 blocks are W's transposed. The numerics are ``fp8gemm.reference``'s (docs/quantization.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..autograd import refuse_grad
from ..quantize import quantize_activation, quantize_weight
from ..reference import BLOCK, reference_quantize
from ..validation import check_source


class Transposed(NamedTuple):
    """An operand in FP8 and its transpose, each with its scales."""

    q: torch.Tensor  # FP8 [M, K]
    scale: torch.Tensor  # fp32, [M, K/128] (activations) or [ceil(M/128), K/128] (weights)
    q_t: torch.Tensor  # FP8 [K, M_pad] (activations) or [K, M] (weights)
    scale_t: torch.Tensor  # fp32, [K, M_pad/128] row-major (activations) or [K/128, ceil(M/128)] (weights)


def padded_rows(m: int) -> int:
    """M rounded up to a whole 128-row block: the transposed operand's row length."""
    return -(-m // BLOCK) * BLOCK


def quantize_with_transpose(
    x: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False, backend: str | None = None
) -> Transposed:
    """x [..., K] (bf16/fp16/fp32; leading dims flattened into M) -> ``Transposed``:

    * ``q``, ``scale``: FP8 [M, K] with fp32 [M, K/128], exactly ``fp8gemm.quantize_activation(x)``'s codes and
      scales, in the layout it returns (the backend's);
    * ``q_t``, ``scale_t``: x^T as FP8 [K, M_pad] with fp32 [K, M_pad/128] row-major, one scale per 128 tokens of
      each column of x; M_pad is M rounded up to 128 and its pad columns hold zero codes (a partial last block is
      quantized over its real tokens).
    """
    check_source("x", x)
    refuse_grad("training.quantize_with_transpose", ("x",), (x,))
    q, scale = quantize_activation(x, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales, backend=backend)
    k = x.shape[-1]
    x2d = x.reshape(-1, k)
    m = x2d.shape[0]
    # zero rows quantize to zero codes and leave each block's amax (so its scale) as the real tokens make it
    x_t = torch.nn.functional.pad(x2d.float(), (0, 0, 0, padded_rows(m) - m)).t()
    q_t, scale_t = reference_quantize(x_t, q.dtype, pow2_scales)
    return Transposed(q, scale, q_t, scale_t)


def quantize_weight_with_transpose(
    w: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
) -> Transposed:
    """W [N, K] float -> ``Transposed``: ``q``, ``scale`` exactly ``fp8gemm.quantize_weight(w)``'s (FP8 [N, K], fp32
    [ceil(N/128), K/128]), and W^T as FP8 [K, N] with fp32 [K/128, ceil(N/128)]: the same 128x128 blocks transposed
    (codes and scale matrix), which is the quantization of W^T itself where N is a multiple of 128."""
    check_source("w", w)
    refuse_grad("training.quantize_weight_with_transpose", ("w",), (w,))
    q, scale = quantize_weight(w, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)
    return Transposed(q, scale, q.t().contiguous(), scale.t().contiguous())
