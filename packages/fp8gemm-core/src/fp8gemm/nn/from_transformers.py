"""transformers' FP8 modules (``FineGrainedFP8Config``: ``FP8Linear``, ``FP8Experts``) as fp8gemm runs them: what
fp8gemm can run as transformers defines them, and the swap ``convert`` makes, onto ``Fp8Linear`` / ``Fp8Experts``
holding the same FP8 weights and scales (no re-quantization).

Read in transformers 5.17.0 and 5.22.2, ``transformers/integrations/finegrained_fp8.py``: ``FP8Linear`` (an
``nn.Linear`` subclass) holds ``weight`` (e4m3fn [N, K]), ``weight_scale_inv`` (fp32 or UE8M0 per ``block_size``
block), ``bias`` or None, ``activation_scheme`` and ``activation_scale`` (static only); ``FP8Experts`` holds
``gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I] with ``*_scale_inv``, and its class wrapper
(``use_experts_implementation``) sets ``has_gate``, ``has_bias``, ``is_transposed``, ``is_concatenated`` and
``_is_expert_parallel``.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from ..protocol import MOE_MAX_EXPERTS, MOE_MAX_TOP_K
from ..reference import BLOCK
from .experts import Fp8Experts, check_experts_shape
from .layer import Fp8Linear, check_linear_shape, prepared_scale, required_fp8_dtype, to_fp8_dtype

SUPPORTED_BLOCK = (BLOCK, BLOCK)  # the DeepSeek-V3 recipe: one weight scale per 128x128 block
FP8_WEIGHTS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
UE8M0 = getattr(torch, "float8_e8m0fnu", None)  # power-of-two scales (torch >= 2.7); exact in fp32
_PLAIN_GATES: tuple | None = None  # filled on first use (transformers is imported only then)


def is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation" or act is torch.nn.functional.silu


def plain_gates() -> tuple:
    """transformers' gates that are ``act_fn(gate) * up`` when no SwiGLU clamp is set: ``FP8Experts._apply_gate``
    and ``_default_apply_gate`` (compared by identity: under torch.compile a function's ``__qualname__`` compares
    wrongly, torch 2.13)."""
    global _PLAIN_GATES
    if _PLAIN_GATES is None:
        from transformers.integrations.finegrained_fp8 import FP8Experts
        from transformers.integrations.moe import _default_apply_gate

        _PLAIN_GATES = (FP8Experts._apply_gate, _default_apply_gate)
    return _PLAIN_GATES


def _block(module) -> object:
    block = getattr(module, "block_size", None)
    return tuple(block) if isinstance(block, (list, tuple)) else block


def _scale_dtype_reason(name: str, scale) -> str | None:
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.float32, UE8M0):
        return f"{name} is {getattr(scale, 'dtype', scale)}, not float32 or float8_e8m0fnu"
    return None


def fp8_experts_reason(experts) -> tuple[str, str] | None:
    """``(route, why)`` when ``fused_experts`` cannot run these FP8 experts as transformers defines them, or None.
    route: ``"refused"`` (biases: no route runs them), ``"eager"`` (the module's own loop over experts, the only one of
    transformers' FP8 routes that takes a static activation scale) or ``"grouped_mm"`` (its
    ``fp8_grouped_mm_experts_forward``). What a call brings (the top k, grad) is the caller's to check."""
    if getattr(experts, "has_bias", False) or getattr(experts, "gate_up_proj_bias", None) is not None:
        return "refused", "has biases; fp8gemm.fused_experts has none (and transformers' FP8Experts takes none either)"
    if getattr(experts, "activation_scheme", "dynamic") == "static":
        return "eager", "activation_scheme='static'; fused_experts quantizes activations per token per 128"
    if not getattr(experts, "has_gate", True) or not hasattr(experts, "gate_up_proj"):
        return "grouped_mm", "no gate (up_proj only, act_fn(up)); fused_experts runs silu(gate) * up"
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True):
        return "grouped_mm", "gate_up_proj is not [E, 2I, H] with the gate rows first"
    up, down = experts.gate_up_proj, experts.down_proj
    if up.dtype not in FP8_WEIGHTS or down.dtype != up.dtype:
        return "grouped_mm", f"weights are {up.dtype} / {down.dtype}, not FP8 e4m3"
    if _block(experts) != SUPPORTED_BLOCK:
        return "grouped_mm", f"block_size = {experts.block_size}; fused_experts takes one scale per 128x128 block"
    for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
        reason = _scale_dtype_reason(name, getattr(experts, name, None))
        if reason:
            return "grouped_mm", reason
    if any(getattr(experts, a, None) is not None for a in ("swiglu_alpha", "swiglu_limit", "limit")):
        return "grouped_mm", "clamped SwiGLU gate (swiglu_alpha / swiglu_limit); fused_experts runs silu(gate) * up"
    gate_fn = getattr(type(experts), "_apply_gate", None)
    if gate_fn is not None and not any(gate_fn is plain for plain in plain_gates()):
        return "grouped_mm", f"{type(experts).__name__} defines its own gating (_apply_gate)"
    if not is_silu(getattr(experts, "act_fn", None)):
        act = type(getattr(experts, "act_fn", None)).__name__
        return "grouped_mm", f"activation {act} is not SiLU; fused_experts runs silu(gate) * up"
    e, two_i, h = up.shape
    if two_i % (2 * BLOCK) or h % BLOCK or tuple(down.shape) != (e, h, two_i // 2):
        return "grouped_mm", f"gate_up_proj {list(up.shape)}, down_proj {list(down.shape)}: H and I must be multiples of {BLOCK}"  # fmt: skip
    if e > MOE_MAX_EXPERTS:
        return "grouped_mm", f"E = {e}: fused_experts takes E <= {MOE_MAX_EXPERTS}"
    return None


def top_k_reason(top_k: int) -> tuple[str, str] | None:
    if top_k > MOE_MAX_TOP_K:
        return "grouped_mm", f"k = {top_k}: fused_experts takes k <= {MOE_MAX_TOP_K}"
    return None


# --- the swap convert makes ------------------------------------------------------------------------------------------


def transformers_fp8_kind(module: nn.Module) -> str | None:
    """``"linear"`` for transformers' ``FP8Linear`` (not its subclasses), ``"experts"`` for its ``FP8Experts``, else
    None. A model holds them only once transformers' FP8 integration is imported: nothing is imported here."""
    integration = sys.modules.get("transformers.integrations.finegrained_fp8")
    if integration is None:
        return None
    if type(module) is getattr(integration, "FP8Linear", None):
        return "linear"
    experts = getattr(integration, "FP8Experts", None)
    return "experts" if experts is not None and isinstance(module, experts) else None


def fp8_linear_reason(linear) -> str | None:
    """Why transformers' ``FP8Linear`` cannot become an ``Fp8Linear`` on its own weights, or None."""
    if linear.weight.dtype not in FP8_WEIGHTS:
        return f"weight is {linear.weight.dtype}, not FP8 e4m3 (FP4 weights come packed in int8)"
    if getattr(linear, "activation_scheme", "dynamic") == "static":
        return "activation_scheme='static'; Fp8Linear quantizes activations per token per 128"
    if _block(linear) != SUPPORTED_BLOCK:
        return f"block_size = {linear.block_size}; Fp8Linear takes one scale per 128x128 block"
    reason = _scale_dtype_reason("weight_scale_inv", linear.weight_scale_inv)
    return reason or check_linear_shape(linear.in_features, linear.out_features)


def _operands(weight: torch.Tensor, scale: torch.Tensor, fp8_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The same FP8 weight and fp32 scale, detached (no copy where the weight is already in ``fp8_dtype``, or the
    dtype the backend for its device takes; else ``to_fp8_dtype``'s exact conversion)."""
    weight, scale = weight.detach(), scale.detach()
    if scale.dtype != torch.float32:
        scale = scale.float()  # UE8M0: powers of two, exact in fp32
    weight, scale = to_fp8_dtype(weight, scale, fp8_dtype or required_fp8_dtype(weight.device) or weight.dtype)
    if not weight.is_contiguous() or weight.data_ptr() % 16:
        weight = weight.clone(memory_format=torch.contiguous_format)
    return weight, scale


def swap_fp8_linear(linear, *, fp8_dtype=None, pow2_scales: bool = False) -> Fp8Linear:
    """An ``Fp8Linear`` holding transformers' ``FP8Linear``'s weight, scale and bias (the same tensors where no
    conversion is needed), its scale in the layout the backend reads."""
    weight, scale = _operands(linear.weight, linear.weight_scale_inv, fp8_dtype)
    bias = linear.bias.detach() if linear.bias is not None else None
    dtype = bias.dtype if bias is not None and bias.dtype in (torch.bfloat16, torch.float16, torch.float32) else None
    layer = Fp8Linear(linear.in_features, linear.out_features, bias is not None, device="meta",
                      dtype=dtype or torch.bfloat16, fp8_dtype=weight.dtype, pow2_scales=pow2_scales)  # fmt: skip
    layer.weight, layer.weight_scale_inv, layer.bias = weight, prepared_scale(scale), bias
    return layer


def fp8_experts_swap_reason(experts) -> str | None:
    """Why transformers' ``FP8Experts`` cannot become an ``Fp8Experts`` on its own weights, or None."""
    reason = fp8_experts_reason(experts)
    if reason:
        return reason[1]
    if getattr(experts, "_is_expert_parallel", False):
        return "expert parallel (ids of other ranks' experts); Fp8Experts holds every expert"
    e, two_i, h = experts.gate_up_proj.shape
    return check_experts_shape(e, h, two_i // 2)


def swap_fp8_experts(experts, *, fp8_dtype=None, pow2_scales: bool = False) -> Fp8Experts:
    """An ``Fp8Experts`` holding transformers' ``FP8Experts``' weights and scales (the same tensors where no
    conversion is needed), its scales in the layout the backend reads."""
    w13, s13 = _operands(experts.gate_up_proj, experts.gate_up_proj_scale_inv, fp8_dtype)
    w2, s2 = _operands(experts.down_proj, experts.down_proj_scale_inv, fp8_dtype)
    e, two_i, h = w13.shape
    module = Fp8Experts(e, h, two_i // 2, device="meta", fp8_dtype=w13.dtype, pow2_scales=pow2_scales)
    module.w13, module.w13_scale_inv = w13, prepared_scale(s13)
    module.w2, module.w2_scale_inv = w2, prepared_scale(s2)
    return module
