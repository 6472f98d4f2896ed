"""``Fp8TrainingExperts``: the routed experts of a mixture-of-experts block trained with every GEMM in FP8
(``fp8gemm.training.fused_experts``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..training.experts import fused_experts as training_fused_experts
from .experts import check_experts_shape


class Fp8TrainingExperts(nn.Module):
    """E experts ``down(silu(gate(x)) * up(x))`` whose forward and backward GEMMs run in FP8 (docs/training.md).

    Parameters, named and shaped as transformers' fused experts (``Qwen3MoeExperts``, ``DeepseekV3Experts``) hold
    them, so state dicts and optimizers see the same tensors:

    * ``gate_up_proj``: [E, 2I, H], each expert's gate (first I rows) then up projection (``fused_experts``' w13);
    * ``down_proj``: [E, H, I] (w2).

    Both stay in high precision (bf16/fp16/fp32) and are quantized per 128x128 block on every forward:
    ``forward(x, topk_ids, topk_weights) = fp8gemm.training.fused_experts(x, topk_ids, topk_weights, gate_up_proj,
    down_proj)``. H and I multiples of 128. ``pow2_scales``: power-of-two scales (UE8M0).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, device=None, dtype=None,
                 pow2_scales: bool = False):  # fmt: skip
        super().__init__()
        problem = check_experts_shape(num_experts, hidden_size, intermediate_size)
        if problem:
            raise ValueError(f"Fp8TrainingExperts: {problem}; keep such experts in high precision (fp8gemm.nn.convert "
                             f"does)")  # fmt: skip
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.pow2_scales = bool(pow2_scales)
        e, h, i = num_experts, hidden_size, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h, device=device, dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(e, h, i, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert's projections as ``nn.Linear`` initialises its weight: uniform in +-1/sqrt(in_features)."""
        if self.gate_up_proj.device.type == "meta":
            return
        with torch.no_grad():
            self.gate_up_proj.uniform_(-1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.hidden_size))
            self.down_proj.uniform_(-1 / math.sqrt(self.intermediate_size), 1 / math.sqrt(self.intermediate_size))

    @classmethod
    def from_experts(cls, experts: nn.Module, *, pow2_scales: bool = False) -> Fp8TrainingExperts:
        """A module holding ``experts``' own ``gate_up_proj`` and ``down_proj`` Parameters (not copies), as
        transformers' fused experts hold them: an optimizer built on the model before the swap keeps training them."""
        gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        if not isinstance(gate_up, nn.Parameter) or not isinstance(down, nn.Parameter):
            raise TypeError(
                f"experts must hold gate_up_proj [E, 2I, H] and down_proj [E, H, I] as nn.Parameters (transformers' "
                f"fused experts), got {type(gate_up).__name__} and {type(down).__name__}"
            )
        e, two_i, h = gate_up.shape
        if tuple(down.shape) != (e, h, two_i // 2):
            raise ValueError(
                f"down_proj must be [E, H, I] = {[e, h, two_i // 2]} to match gate_up_proj {[e, two_i, h]}"
            )
        module = cls(e, h, two_i // 2, device="meta", dtype=gate_up.dtype, pow2_scales=pow2_scales)
        module.gate_up_proj, module.down_proj = gate_up, down
        return module

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H] in x's dtype (or [..., H] with ids and weights [..., k])."""
        if x.dim() != 2 and x.dim() == topk_ids.dim() == topk_weights.dim():
            flat = (t.reshape(-1, t.shape[-1]) for t in (x, topk_ids, topk_weights))
            return self.forward(*flat).view(x.shape)
        return training_fused_experts(x, topk_ids, topk_weights, self.gate_up_proj, self.down_proj,
                                      pow2_scales=self.pow2_scales)  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, dtype={self.gate_up_proj.dtype}, "
            f"fp8=(1x128 activations, 128x128 weights)" + (", pow2_scales=True" if self.pow2_scales else "")
        )
