"""The seam of ``fused_experts``' pipeline, as vLLM's modular fused-MoE kernel splits it: prepare (route the slots to
sorted rows, quantize x into them), experts (the gate/up grouped GEMM, SiLU-and-mul + quantize, the down grouped GEMM)
and finalize (each token's weighted sum of its rows). Two implementations: the backend's step kernels (moe_steps.py)
and torch operations (moe_torch.py), which run where a backend has no step kernels and are the tests' comparison.
The grouped GEMMs are the same in both. docs/moe.md, "Steps".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from .grouped import run_checked_grouped
from .grouped_checks import GroupedShape
from .protocol import GROUPED_CONTIGUOUS


class MoeShape(NamedTuple):
    tokens: int  # T
    top_k: int  # k
    experts: int  # E
    hidden: int  # H
    intermediate: int  # I


class MoePlan(NamedTuple):
    """One checked ``fused_experts`` call: what every step needs besides the tensors."""

    shape: MoeShape
    backend: object  # the Backend that runs on x's device (fp8gemm.reference.REFERENCE: the torch reference)
    fp8_dtype: torch.dtype  # w13's
    pow2: bool  # power-of-two activation scales
    y_dtype: torch.dtype  # the down GEMM's output: bf16 for bf16 x, else fp32
    out_dtype: torch.dtype  # x's


class Routed(NamedTuple):
    """What prepare gives: the T * k slots as rows sorted by expert, and what finalize needs to sum them back."""

    offs: torch.Tensor  # int32 [E]: cumulative row ends per expert (rows past offs[-1] belong to no expert)
    position: torch.Tensor  # [T, k]: each slot's row (how finalize reads an unrouted slot is the implementation's)
    q: torch.Tensor  # FP8 [T * k, H]: each row's token, quantized
    scale: torch.Tensor  # fp32 [T * k, H/128]: their scales
    weights: torch.Tensor  # [T, k]: the routing weights finalize applies


class MoeSteps(ABC):
    """One implementation of the seam for one plan: prepare, activation, finalize and buffer; experts and run are
    shared."""

    def __init__(self, plan: MoePlan):
        self.plan = plan

    @abstractmethod
    def prepare(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Routed:
        """The slots' rows sorted by expert, x quantized into them."""

    @abstractmethod
    def activation(self, h: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """silu(gate) * up of the fp32 gate/up product [rows, 2I], quantized: (FP8 [rows, I], scales)."""

    @abstractmethod
    def finalize(self, y: torch.Tensor, routed: Routed) -> torch.Tensor:
        """``out[t] = sum_j weights[t, j] * y[position[t, j]]`` in x's dtype."""

    @abstractmethod
    def buffer(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A GEMM output of ``rows`` sorted rows; what the rows past offs[-1] must hold is the implementation's."""

    def experts(self, routed: Routed, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
        """The two grouped GEMMs around the activation: the down projection of each sorted row, [T * k, H]."""
        rows, hidden = routed.q.shape
        inter, device = w2.shape[2], routed.q.device
        h = self.buffer(rows, 2 * inter, torch.float32, device)
        _grouped(self.plan.backend, routed.q, w13, routed.scale, w13_scale, routed.offs, h)
        aq, a_scale = self.activation(h, routed.offs)
        y = self.buffer(rows, hidden, self.plan.y_dtype, device)
        _grouped(self.plan.backend, aq, w2, a_scale, w2_scale, routed.offs, y)
        return y

    def run(self, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
        """prepare -> experts -> finalize, on checked inputs of at least one token."""
        routed = self.prepare(x, topk_ids, topk_weights)
        return self.finalize(self.experts(routed, w13, w13_scale, w2, w2_scale), routed)


def _grouped(backend, a, b, a_scale, b_scale, offs, out) -> None:
    """One contiguous grouped GEMM on operands fused_experts made or checked: not checked again."""
    if a.shape[0]:
        shape = GroupedShape(b.shape[0], a.shape[0], b.shape[1], a.shape[1])
        run_checked_grouped(backend, GROUPED_CONTIGUOUS, shape, a, b, a_scale, b_scale, offs, out)
