"""``fused_experts``' pipeline in torch operations: the moe_pipeline.py seam where the backend has no step kernels
(the CPU, the reference backend, a binary built before the entries), and the step kernels' comparison in the tests.
x is quantized once per token and its FP8 rows gathered in expert order; no value is read on the host.
docs/moe.md, "Steps".
"""

from __future__ import annotations

import torch

from . import runtime
from .moe_pipeline import MoeSteps, Routed
from .reference import BLOCK, REFERENCE, reference_quantize
from .runtime import empty_scale, kernel_quantize

COMBINE_CHUNK_BYTES = 64 << 20  # the fp32 weighted rows the combine holds at once


def sort_by_expert(topk_ids: torch.Tensor, experts: int):
    """Flat (token, choice) slots in expert order. An id outside [0, E) becomes E: its slots sort last, past every
    group, and select nothing. Returns (valid [T*k], sorted expert ids, order: the flat slot of each sorted row)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    valid = (flat >= 0) & (flat < experts)
    expert = torch.where(valid, flat, experts)
    sorted_expert, order = torch.sort(expert, stable=True)
    return valid, sorted_expert, order


def group_ends(sorted_expert: torch.Tensor, experts: int) -> torch.Tensor:
    """int32 [E]: each expert's cumulative row end in the sorted rows (``offs``)."""
    ids = torch.arange(experts, device=sorted_expert.device)
    return torch.searchsorted(sorted_expert, ids, right=True).to(torch.int32)


def take_rows(q: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """FP8 rows gathered by ``index`` (as bytes: every device gathers uint8)."""
    return q.view(torch.uint8).index_select(0, index).view(q.dtype)


def silu_and_mul(h: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up in fp32 from the fp32 gate/up product (its first I columns the gate, the next I the up)."""
    return torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]


def quantize_on(backend, rows: torch.Tensor, fp8_dtype: torch.dtype, pow2: bool):
    """``quantize_activation`` of 2-D ``rows`` on the plan's backend: its kernel where it has one (the plan checked
    that its FP8 dtype is w13's), else the reference, scales in the backend's layout."""
    if backend is not REFERENCE and backend.quantize is not None:
        with runtime.on_device(rows.device):
            return kernel_quantize(backend, rows, pow2)
    q, scale = reference_quantize(rows, fp8_dtype, pow2)
    if backend is REFERENCE:
        return q, scale
    laid_out, _ = empty_scale(rows.shape[0], rows.shape[1] // BLOCK, backend.a_scale_layout, rows.device)
    return q, laid_out.copy_(scale)


def combine(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * y[rows[t, j]]``: each token's k rows gathered, weighted and summed in fp32
    over j, no atomics (the same bits on every run), in chunks of tokens whose fp32 products fit COMBINE_CHUNK_BYTES
    (one chunk for a decode step)."""
    tokens, k = rows.shape
    hidden = y.shape[1]
    out = torch.empty((tokens, hidden), dtype=dtype, device=y.device)
    step = max(1, COMBINE_CHUNK_BYTES // (k * hidden * 4))
    for start in range(0, tokens, step):
        part = slice(start, start + step)
        picked = y.index_select(0, rows[part].reshape(-1)).view(-1, k, hidden)
        out[part] = (picked * weights[part, :, None]).sum(1)
    return out


class TorchSteps(MoeSteps):
    """The seam in torch operations. A slot that selects nothing keeps a sorted row past offs[-1], which no GEMM
    writes: the outputs are zero-filled, and its weight becomes 0."""

    def prepare(self, x, topk_ids, topk_weights) -> Routed:
        plan = self.plan
        tokens, k = topk_ids.shape
        xq, xs = quantize_on(plan.backend, x, plan.fp8_dtype, plan.pow2)  # once per token: rows gathered in FP8
        valid, sorted_expert, order = sort_by_expert(topk_ids, plan.shape.experts)
        token = order // k
        q, scale = take_rows(xq, token), xs.index_select(0, token)  # the FP8 rows, not a bf16 copy
        position = torch.empty_like(order).scatter_(0, order, torch.arange(tokens * k, device=order.device))
        weights = torch.where(valid.view(tokens, k), topk_weights.float(), 0.0)
        return Routed(group_ends(sorted_expert, plan.shape.experts), position.view(tokens, k), q, scale, weights)

    def activation(self, h, offs):
        return quantize_on(self.plan.backend, silu_and_mul(h, h.shape[1] // 2), self.plan.fp8_dtype, self.plan.pow2)

    def finalize(self, y, routed: Routed):
        return combine(y, routed.position, routed.weights, self.plan.out_dtype)

    def buffer(self, rows, cols, dtype, device):
        return torch.zeros((rows, cols), dtype=dtype, device=device)
