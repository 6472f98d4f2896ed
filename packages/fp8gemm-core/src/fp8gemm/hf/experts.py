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
from typing import NamedTuple

import torch

from .. import runtime
from ..moe import fused_experts
from ..nn.from_transformers import fp8_experts_reason, plain_gates, top_k_reason
from .operands import backend_scale, copied, may_keep, stamp

NAME = "fp8gemm"
_PLAN = "_fp8gemm_plan"  # the module's Plan, a plain attribute: no buffer, no state_dict entry
_TENSORS = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")
_warned: set = set()


class ExpertsFallbackWarning(UserWarning):
    """``experts_implementation="fp8gemm"`` met experts ``fused_experts`` does not run; transformers' route runs them."""


class Plan(NamedTuple):
    """What a call of these experts needs and what cannot change between calls, made on the first call and again
    when a weight or scale changes (load, ``.to()``, an in-place write)."""

    stamps: tuple  # of the four tensors
    copied: tuple[bool, ...]  # which of them is kept as a converted copy (a scale)
    fallback: tuple[str, str] | None  # (route, why): fused_experts cannot run them (fp8_experts_reason)
    operands: tuple  # w13, w13 scale, w2, w2 scale as fused_experts reads them; () with a fallback


def fallback_reason(experts, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> tuple[str, str] | None:
    """``(route, why)`` when ``fused_experts`` cannot run these experts on this call, or None (the module's own part
    from its :class:`Plan`)."""
    return _reason(experts_plan(experts), hidden_states, top_k_index)


def _reason(plan: Plan, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> tuple[str, str] | None:
    reason = plan.fallback or top_k_reason(top_k_index.shape[-1])
    if reason is None and torch.is_grad_enabled() and hidden_states.requires_grad:
        return "grouped_mm", "the input requires grad; fused_experts is inference only"
    return reason


def _tensors(experts) -> tuple:
    params = experts._parameters  # what FP8Experts registers them in; read without Module.__getattr__ per name
    return tuple(params[n] if n in params else getattr(experts, n, None) for n in _TENSORS)


def _stamps(tensors: tuple, copies: tuple) -> tuple:
    return tuple([stamp(t, c) if isinstance(t, torch.Tensor) else t for t, c in zip(tensors, copies, strict=True)])


def _make_plan(experts, tensors: tuple) -> Plan:
    """The plan, its stamps left empty (a compiled graph reads no address)."""
    fallback = fp8_experts_reason(experts)
    if fallback is not None:
        return Plan((), (False,) * len(tensors), fallback, ())
    up, up_scale, down, down_scale = tensors
    operands = up.detach(), backend_scale(up_scale), down.detach(), backend_scale(down_scale)
    if torch.compiler.is_compiling():
        return Plan((), (), None, operands)
    copies = (False, copied(up_scale, operands[1]), False, copied(down_scale, operands[3]))
    return Plan((), copies, None, operands)


def experts_plan(experts) -> Plan:
    """The experts' :class:`Plan`, kept on the module; under CUDA-graph capture a plan whose scales were converted
    in the graph is not kept (its kernels have not run yet). Inside a compiled graph the kept plan is used as it is,
    or made in the graph if none is."""
    kept = experts.__dict__.get(_PLAN)
    tensors = _tensors(experts)
    if torch.compiler.is_compiling():
        return kept if kept is not None else _make_plan(experts, tensors)
    if kept is None or kept.stamps != _stamps(tensors, kept.copied):
        plan = _make_plan(experts, tensors)
        ops = plan.operands
        if ops and not (may_keep(tensors[1], ops[1]) and may_keep(tensors[3], ops[3])):
            return plan  # made again on the next call
        kept = plan._replace(stamps=_stamps(tensors, plan.copied))
        object.__setattr__(experts, _PLAN, kept)
    return kept


def weight_scales(experts) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate/up and down weight scales as fp32 in the layout the backend reads (``prepare_weight_scale``),
    converted once per :class:`Plan`."""
    operands = experts_plan(experts).operands
    return operands[1], operands[3]


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
    plan = experts_plan(self)
    reason = _reason(plan, hidden_states, top_k_index)
    if reason is not None:
        if reason[0] == "refused":
            raise NotImplementedError(f'experts_implementation="{NAME}": {type(self).__name__} {reason[1]}')
        _warn_once(self, *reason)
        return _fallback(self, reason[0])(self, hidden_states, top_k_index, top_k_weights)
    shape = hidden_states.shape
    flat = len(shape) == 2
    x = hidden_states if flat else hidden_states.reshape(-1, shape[-1])
    ids = top_k_index if flat else top_k_index.reshape(-1, top_k_index.shape[-1])
    weights = top_k_weights if flat else top_k_weights.reshape(ids.shape)
    if runtime.device_index(ids) < 0:  # the CPU reference checks ids; on a GPU one >= E selects nothing
        ids = torch.where(ids < plan.operands[0].shape[0], ids, -1)
    out = fused_experts(x, ids, weights, *plan.operands)
    return out if flat else out.view(shape)


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
    plain_gates()  # before any trace reads it
    ALL_FP8_EXPERTS_FUNCTIONS.register(name, fp8_experts_forward)
    ALL_EXPERTS_FUNCTIONS.register(name, unquantized_experts_forward)
    return name
