"""The float64 yardstick of ``fp8gemm.fused_experts``: the same quantized operands, exact products.

Written apart from the pipeline (a loop over experts and each expert's slots, no sort, no grouped op): x is quantized
as the op quantizes it (``reference_quantize``, which every backend's kernel matches bit for bit); each product of
FP8 operands and their scales is taken in float64; the activation silu(gate) * up is computed in float64, rounded to
fp32 and quantized per 128 of I as the op quantizes its fp32 activation; the routing weights sum in float64.
"""

from __future__ import annotations

import torch

from .reference import BLOCK, reference_quantize


def dequantize64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 [N, K] with per-row ([N, K/128]) or per-block ([ceil(N/128), K/128]) scales, in float64."""
    rows = q.shape[0]
    per_row = scale.double().repeat_interleave(1 if scale.shape[0] == rows else BLOCK, dim=0)[:rows]
    return q.double() * per_row.repeat_interleave(BLOCK, dim=1)


def reference_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *,
                            pow2_scales: bool = False) -> torch.Tensor:  # fmt: skip
    """float64 [T, H]: ``sum_j w[t, j] * down_e(quantized(silu(gate_e(xq[t])) * up_e(xq[t])))``; slots whose id is
    outside [0, E) contribute nothing."""
    fp8 = w13.dtype
    inter = w13.shape[1] // 2
    xq, xs = reference_quantize(x, fp8, pow2_scales)
    x64 = dequantize64(xq, xs)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(w13.shape[0]):
        token, choice = (topk_ids == e).nonzero(as_tuple=True)
        if not token.numel():
            continue
        h = x64[token] @ dequantize64(w13[e], w13_scale[e]).t()
        gate, up = h[:, :inter], h[:, inter:]
        act = gate * torch.sigmoid(gate) * up
        aq, a_scale = reference_quantize(act.float(), fp8, pow2_scales)
        y = dequantize64(aq, a_scale) @ dequantize64(w2[e], w2_scale[e]).t()
        out.index_add_(0, token, y * topk_weights[token, choice].double()[:, None])
    return out
