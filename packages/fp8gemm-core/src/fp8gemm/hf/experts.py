"""``experts_implementation="fp8gemm"``: transformers' FP8 experts (``FP8Experts``) as one ``fp8gemm.fused_experts``
call per layer.

transformers 5.x dispatches the forward of its experts modules by name (read in 5.17.0 and 5.22.2,
``transformers/integrations/moe.py``): ``use_experts_implementation`` replaces the class's forward by one that calls
``experts_interface.get_interface(self.config._experts_implementation, original_forward)(self, hidden_states,
top_k_index, top_k_weights)``, where the interface is an ``ExpertsInterface`` (a ``GeneralInterface``: a mapping
whose classmethod ``register(name, function)`` adds to every instance). The FP8 experts that ``FineGrainedFP8Config``
puts in a model (``replace_with_fp8_linear``, ``integrations/finegrained_fp8.py``) dispatch through
``ALL_FP8_EXPERTS_FUNCTIONS`` (an ``FP8ExpertsInterface``); unquantized experts through ``ALL_EXPERTS_FUNCTIONS``. A
model accepts ``experts_implementation=name`` in ``from_pretrained`` and ``set_experts_implementation`` when the
name is ``"eager"`` or a key of either interface (``PreTrainedModel.get_correct_experts_implementation``,
``modeling_utils.py``, the same in both versions), so :func:`register_experts_implementation` registers
:func:`fp8_experts_forward` in the FP8 interface and :func:`unquantized_experts_forward` (transformers' own
``grouped_mm``, for experts a quantization left in bf16) in the other. docs/transformers.md.
"""

from __future__ import annotations

import inspect
import warnings

import torch

from .. import runtime
from ..moe import fused_experts
from ..nn.convert import _is_silu
from ..ops import prepare_weight_scale
from ..protocol import MOE_MAX_EXPERTS, MOE_MAX_TOP_K
from ..reference import BLOCK
from .finegrained_fp8 import FP8_WEIGHTS, SUPPORTED_BLOCK, UE8M0

NAME = "fp8gemm"
_CACHE = "_fp8gemm_weight_scales"  # (stamp, gate_up scale, down scale) in the layout the backend reads
_warned: set = set()
_PLAIN_GATES: tuple | None = None  # filled on first use (transformers is imported only then)


class ExpertsFallbackWarning(UserWarning):
    """``experts_implementation="fp8gemm"`` met experts ``fused_experts`` does not run; transformers' route runs them."""


def fallback_reason(experts, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> tuple[str, str] | None:
    """``(route, why)`` when ``fused_experts`` cannot run these experts as transformers defines them, or None.
    route: ``"grouped_mm"`` (transformers' ``fp8_grouped_mm_experts_forward``) or ``"eager"`` (the module's own
    loop over experts, the only one of transformers' FP8 routes that takes a static activation scale)."""
    if getattr(experts, "activation_scheme", "dynamic") == "static":
        return "eager", "activation_scheme='static'; fused_experts quantizes activations per token per 128"
    if not getattr(experts, "has_gate", True) or not hasattr(experts, "gate_up_proj"):
        return "grouped_mm", "no gate (up_proj only, act_fn(up)); fused_experts runs silu(gate) * up"
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True):
        return "grouped_mm", "gate_up_proj is not [E, 2I, H] with the gate rows first"
    up, down = experts.gate_up_proj, experts.down_proj
    if up.dtype not in FP8_WEIGHTS or down.dtype != up.dtype:
        return "grouped_mm", f"weights are {up.dtype} / {down.dtype}, not FP8 e4m3"
    block = getattr(experts, "block_size", None)
    if (tuple(block) if isinstance(block, (list, tuple)) else block) != SUPPORTED_BLOCK:
        return "grouped_mm", f"block_size = {block}; fused_experts takes one scale per 128x128 block"
    for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
        scale = getattr(experts, name, None)
        if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.float32, UE8M0):
            return "grouped_mm", f"{name} is {getattr(scale, 'dtype', scale)}, not float32 or float8_e8m0fnu"
    if any(getattr(experts, a, None) is not None for a in ("swiglu_alpha", "swiglu_limit", "limit")):
        return "grouped_mm", "clamped SwiGLU gate (swiglu_alpha / swiglu_limit); fused_experts runs silu(gate) * up"
    gate_fn = getattr(type(experts), "_apply_gate", None)
    if gate_fn is not None and not any(gate_fn is plain for plain in _plain_gates()):
        return "grouped_mm", f"{type(experts).__name__} defines its own gating (_apply_gate)"
    if not _is_silu(getattr(experts, "act_fn", None)):
        act = type(getattr(experts, "act_fn", None)).__name__
        return "grouped_mm", f"activation {act} is not SiLU; fused_experts runs silu(gate) * up"
    (e, two_i, h), k = up.shape, top_k_index.shape[-1]
    if two_i % (2 * BLOCK) or h % BLOCK or tuple(down.shape) != (e, h, two_i // 2):
        return "grouped_mm", f"gate_up_proj {list(up.shape)}, down_proj {list(down.shape)}: H and I must be multiples of {BLOCK}"  # fmt: skip
    if e > MOE_MAX_EXPERTS or k > MOE_MAX_TOP_K:
        return "grouped_mm", f"E = {e}, k = {k}: fused_experts takes E <= {MOE_MAX_EXPERTS}, k <= {MOE_MAX_TOP_K}"
    if torch.is_grad_enabled() and hidden_states.requires_grad:
        return "grouped_mm", "the input requires grad; fused_experts is inference only"
    return None


def _plain_gates() -> tuple:
    """transformers' gates that are ``act_fn(gate) * up`` when no SwiGLU clamp is set: ``FP8Experts._apply_gate``
    and ``_default_apply_gate`` (compared by identity: under torch.compile a function's ``__qualname__`` compares
    wrongly, torch 2.13)."""
    global _PLAIN_GATES
    if _PLAIN_GATES is None:
        from transformers.integrations.finegrained_fp8 import FP8Experts
        from transformers.integrations.moe import _default_apply_gate

        _PLAIN_GATES = (FP8Experts._apply_gate, _default_apply_gate)
    return _PLAIN_GATES


def _prepare(scale: torch.Tensor) -> torch.Tensor:
    scale = scale.detach()
    if scale.dtype != torch.float32:
        scale = scale.float()  # UE8M0 (scale_fmt="ue8m0"): powers of two, exact in fp32
    if scale.device.type == "meta":
        return scale
    try:
        return prepare_weight_scale(scale)
    except RuntimeError:  # no backend for this GPU: fused_experts names the package to install
        return scale


def _stamp(t: torch.Tensor) -> tuple:
    try:
        version = t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        version = None
    return t.device, t.dtype, tuple(t.shape), t.data_ptr(), version


def weight_scales(experts) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate/up and down weight scales as fp32 in the layout the backend reads (``prepare_weight_scale``),
    converted once and kept on the module (not in its state_dict); converted again when a scale changes (load,
    ``.to()``). Under CUDA-graph capture they are converted in the graph and not kept. Inside a compiled graph the
    kept ones are used as they are, or converted in the graph if none is."""
    up_s, down_s = experts.gate_up_proj_scale_inv, experts.down_proj_scale_inv
    kept = getattr(experts, _CACHE, None)
    if torch.compiler.is_compiling():
        return kept[1:] if kept is not None else (_prepare(up_s), _prepare(down_s))
    stamp = (_stamp(up_s), _stamp(down_s))
    if kept is None or kept[0] != stamp:
        kept = (stamp, _prepare(up_s), _prepare(down_s))
        # under capture the graph's own kernels convert them, and have not run yet: not for later calls
        if up_s.is_cuda and runtime.capturing():
            return kept[1], kept[2]
        object.__setattr__(experts, _CACHE, kept)  # a plain attribute: no buffer, no state_dict entry
    return kept[1], kept[2]


def _warn_once(experts, route: str, why: str) -> None:
    key = (type(experts).__name__, route, why)
    if key in _warned or torch.compiler.is_compiling():
        return
    _warned.add(key)
    warnings.warn(f'experts_implementation="{NAME}": {type(experts).__name__} runs transformers\' {route} route, '
                  f"not fp8gemm.fused_experts: {why}", ExpertsFallbackWarning, stacklevel=3)  # fmt: skip


def _fallback(experts, route: str):
    if route == "eager":  # the class's own forward, below every use_experts_implementation wrapper
        return inspect.unwrap(type(experts).forward)
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS

    return ALL_FP8_EXPERTS_FUNCTIONS["grouped_mm"]


def fp8_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """transformers' FP8 experts forward as ``fp8gemm.fused_experts(hidden_states, top_k_index, top_k_weights,
    gate_up_proj, gate_up_proj_scale_inv, down_proj, down_proj_scale_inv)``: ``hidden_states [T, H]`` -> ``[T, H]`` in
    its dtype. Expert ids outside [0, E) (expert-parallel sentinels, ``>= E``) select nothing. Experts it does not
    run (:func:`fallback_reason`) go to transformers' own route, with an :class:`ExpertsFallbackWarning` once; biases
    are refused."""
    if getattr(self, "has_bias", False) or getattr(self, "gate_up_proj_bias", None) is not None:
        raise NotImplementedError(
            f'experts_implementation="{NAME}": {type(self).__name__} has biases; fp8gemm.fused_experts has none (and '
            "transformers' FP8Experts takes none either)"
        )
    reason = fallback_reason(self, hidden_states, top_k_index)
    if reason is not None:
        _warn_once(self, *reason)
        return _fallback(self, reason[0])(self, hidden_states, top_k_index, top_k_weights)
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    ids = top_k_index.reshape(-1, top_k_index.shape[-1])
    weights = top_k_weights.reshape(ids.shape)
    if ids.device.type == "cpu":  # the CPU path checks ids; on a GPU one >= E selects nothing without a launch
        ids = torch.where(ids < self.gate_up_proj.shape[0], ids, -1)
    up_scale, down_scale = weight_scales(self)
    out = fused_experts(x, ids, weights, self.gate_up_proj.detach(), up_scale, self.down_proj.detach(), down_scale)
    return out.view(shape)


def unquantized_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """``"fp8gemm"`` for experts without FP8 weights (a bf16 model, or experts a quantization config left out): fp8gemm
    has nothing to run, transformers' ``grouped_mm`` runs them (an :class:`ExpertsFallbackWarning` once)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    _warn_once(self, "grouped_mm", "its weights are not FP8 (fp8gemm runs transformers' FP8Experts)")
    return ALL_EXPERTS_FUNCTIONS["grouped_mm"](self, hidden_states, top_k_index, top_k_weights)


def register_experts_implementation(name: str = NAME) -> str:
    """Register ``name`` (default ``"fp8gemm"``) as an experts implementation of transformers in this process:
    :func:`fp8_experts_forward` for its FP8 experts, :func:`unquantized_experts_forward` for the others. Then
    ``from_pretrained(..., experts_implementation=name)`` and ``model.set_experts_implementation(name)`` accept it.
    Returns ``name``. Needs transformers 5.x with FP8 experts (``ALL_FP8_EXPERTS_FUNCTIONS``; read in 5.17.0 and
    5.22.2); it does not load any finegrained-fp8 kernel (fallbacks and FP8 linears do: see use_in_transformers)."""
    try:
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as exc:
        raise ImportError(
            "register_experts_implementation needs transformers 5.x with FP8 experts "
            f"(transformers.integrations.finegrained_fp8.ALL_FP8_EXPERTS_FUNCTIONS): {exc}"
        ) from exc
    _plain_gates()  # before any trace reads it
    ALL_FP8_EXPERTS_FUNCTIONS.register(name, fp8_experts_forward)
    ALL_EXPERTS_FUNCTIONS.register(name, unquantized_experts_forward)
    return name
