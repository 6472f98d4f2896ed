"""The k-grouped weight gradient's float64 yardstick, shared by its GPU tests and the gfx942 emulation's."""

from __future__ import annotations

import torch
from fp8gemm.moe_reference import dequantize64
from fp8gemm.reference import BLOCK


def kgrouped_float64(a_t, b_t, a_scale_t, b_scale_t, counts) -> torch.Tensor:
    """float64 [E, N, K] on the operands' device: each expert's product of the dequantized FP8 operands over its own
    token columns of the per-expert 128-aligned layout (expert e's first at 128 (e + tokens before it // 128)), found
    by a host loop over ``counts``."""
    a64, b64 = dequantize64(a_t, a_scale_t), dequantize64(b_t, b_scale_t)
    out, start = [], 0
    for e, tokens in enumerate(counts):
        first = BLOCK * (e + start // BLOCK)
        out.append(a64[:, first : first + tokens] @ b64[:, first : first + tokens].t())
        start += tokens
    return torch.stack(out)
