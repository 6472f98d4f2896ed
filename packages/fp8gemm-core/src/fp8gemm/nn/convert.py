"""``convert``: swap a model's eligible ``nn.Linear`` layers for ``Fp8Linear``, and its mixture-of-experts experts for
``Fp8Experts``, in place; with ``training=True`` for ``Fp8TrainingLinear`` and ``Fp8TrainingExperts``."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import nn

from .experts import Fp8Experts, check_experts_shape
from .from_transformers import (
    fp8_experts_swap_reason,
    fp8_linear_reason,
    is_silu,
    swap_fp8_experts,
    swap_fp8_linear,
    transformers_fp8_kind,
)
from .layer import Fp8Linear, check_linear_shape
from .training import Fp8TrainingLinear, check_training_shape
from .training_experts import Fp8TrainingExperts

SkipRule = Iterable[str] | Callable[[str, nn.Module], bool]

# Hugging Face's FP8 quantizers keep the output projection in full precision (the last, tied or
# output-embedding module), as vLLM and the FP8 checkpoints themselves do: logits are the most
# sensitive product, and with a large vocabulary lm_head is one layer among hundreds.
DEFAULT_SKIP = ("lm_head",)


class ReferenceOnCpuWarning(UserWarning):
    """Converted layers on CPU run fp8gemm's pure-torch reference: right numbers, far slower than bf16."""


class ConversionReport(NamedTuple):
    """What ``convert`` did: qualified names converted, and the ``nn.Linear`` layers and experts left alone with why."""

    converted: list[str]
    skipped: dict[str, str]

    def __str__(self) -> str:
        lines = [f"{len(self.converted)} layers converted (nn.Linear to Fp8Linear or Fp8TrainingLinear, experts to Fp8Experts "
                 f"or Fp8TrainingExperts), "
                 f"{len(self.skipped)} left alone"]  # fmt: skip
        lines += [f"  {name}: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines)


def _skip_matcher(skip: SkipRule) -> Callable[[str, nn.Module], str | None]:
    if callable(skip):
        return lambda name, module: "skip predicate" if skip(name, module) else None
    if isinstance(skip, str):
        raise TypeError(f"skip must be a collection of names or a predicate, got the string {skip!r}; use ({skip!r},)")
    patterns = tuple(skip)

    def match(name: str, module: nn.Module) -> str | None:
        for pattern in patterns:
            if name == pattern or name.endswith("." + pattern):
                return f"skip={pattern!r}"
        return None

    return match


def _parameter_owners(model: nn.Module) -> dict[int, dict[int, str]]:
    """Parameter id -> {id of each module holding it: that module's name}; two modules = tied weights."""
    owners: dict[int, dict[int, str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), {}).setdefault(id(module), f"{name}.{param_name}" if name else param_name)
    return owners


def _linear_reason(linear: nn.Module, owners, training: bool = False) -> str | None:
    if type(linear) is not nn.Linear:  # e.g. MultiheadAttention's out_proj, whose owner reads .weight directly
        return f"{type(linear).__name__} is a subclass of nn.Linear; only plain nn.Linear is converted"
    check_shape = check_training_shape if training else check_linear_shape
    reason = check_shape(linear.in_features, linear.out_features)
    if reason:
        return reason
    if linear.weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"weight dtype {linear.weight.dtype} is not bfloat16/float16/float32"
    sharers = [n for module_id, n in owners.get(id(linear.weight), {}).items() if module_id != id(linear)]
    if sharers:
        return f"weight tied to {', '.join(sharers)}"
    return None


def is_fused_experts(module: nn.Module) -> bool:
    """The fused 3-D form of a mixture of experts' weights, as transformers' ``@use_experts_implementation`` classes
    hold them (``Qwen3MoeExperts``, ``DeepseekV3Experts``): ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]
    tensors, called as ``experts(hidden_states, top_k_index, top_k_weights)`` by the model's MoE block."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == down.dim() == 3


def _experts_reason(experts: nn.Module) -> str | None:
    """Why ``fused_experts`` cannot run these experts as the model defines them, or None."""
    if getattr(experts, "is_transposed", False):
        return "weights stored transposed (gate_up_proj [E, H, 2I]); fp8gemm takes [E, 2I, H]"
    if getattr(experts, "has_bias", False) or getattr(experts, "gate_up_proj_bias", None) is not None:
        return "the experts have biases; fp8gemm.fused_experts has none"
    if not getattr(experts, "has_gate", True) or not getattr(experts, "is_concatenated", True):
        return "gate and up projections are not stacked as [gate; up] rows"
    gate_fn = getattr(type(experts), "_apply_gate", None)
    if gate_fn is not None and getattr(gate_fn, "__name__", "") != "_default_apply_gate":
        return f"{type(experts).__name__} defines its own gating (_apply_gate); fp8gemm runs silu(gate) * up"
    act = getattr(experts, "act_fn", None)
    if not is_silu(act):
        return f"activation {type(act).__name__} is not SiLU; fp8gemm.fused_experts runs silu(gate) * up"
    (e, two_i, h), down = experts.gate_up_proj.shape, tuple(experts.down_proj.shape)
    if two_i % 2 or down != (e, h, two_i // 2):
        return f"down_proj {list(down)} does not match gate_up_proj {[e, two_i, h]} as [E, H, I]"
    reason = check_experts_shape(e, h, two_i // 2)
    if reason:
        return reason
    dtypes = {experts.gate_up_proj.dtype, experts.down_proj.dtype}
    if not dtypes <= {torch.bfloat16, torch.float16, torch.float32}:
        return f"weight dtypes {sorted(map(str, dtypes))} are not bfloat16/float16/float32"
    return None


def _kind(module) -> str | None:
    """What ``convert`` replaces ``module`` with: transformers' FP8 modules (``"linear"``, ``"experts"``: swapped
    onto the same weights), ``"fused experts"`` and ``"nn.Linear"`` (quantized), or None."""
    if module is None:
        return None
    kind = transformers_fp8_kind(module)
    if kind is not None:
        return kind
    if is_fused_experts(module):
        return "fused experts"
    return "nn.Linear" if isinstance(module, nn.Linear) else None


def _training_experts_reason(experts: nn.Module) -> str | None:
    """Why ``Fp8TrainingExperts`` cannot hold these experts' Parameters, or None."""
    reason = _experts_reason(experts)
    if reason:
        return reason
    if not isinstance(experts.gate_up_proj, nn.Parameter) or not isinstance(experts.down_proj, nn.Parameter):
        return "gate_up_proj / down_proj are not nn.Parameters: nothing to train"
    return None


def _reason_to_keep(kind: str, module, owners, training: bool) -> str | None:
    if training:  # the FP8 training layers exist for plain nn.Linear and fused experts
        if kind == "fused experts":
            return _training_experts_reason(module)
        if kind != "nn.Linear":
            return f"training=True converts plain nn.Linear layers and fused experts only, not {kind}"
        return _linear_reason(module, owners, training=True)
    if kind == "linear":
        return fp8_linear_reason(module)
    if kind == "experts":
        return fp8_experts_swap_reason(module)
    if kind == "fused experts":
        return _experts_reason(module)
    return _linear_reason(module, owners)


def _replacement(kind: str, module, fp8_dtype, pow2_scales: bool, training: bool) -> nn.Module:
    if training:
        if kind == "fused experts":
            return Fp8TrainingExperts.from_experts(module, pow2_scales=pow2_scales)
        return Fp8TrainingLinear.from_linear(module, pow2_scales=pow2_scales)
    if kind == "linear":
        return swap_fp8_linear(module, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)
    if kind == "experts":
        return swap_fp8_experts(module, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)
    if kind == "fused experts":
        return Fp8Experts.from_weights(module.gate_up_proj, module.down_proj, fp8_dtype=fp8_dtype,
                                       pow2_scales=pow2_scales)  # fmt: skip
    return Fp8Linear.from_linear(module, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)


def convert(
    model: nn.Module,
    *,
    skip: SkipRule = DEFAULT_SKIP,
    fp8_dtype: torch.dtype | None = None,
    pow2_scales: bool = False,
    training: bool = False,
) -> ConversionReport:
    """Replace every eligible ``nn.Linear`` inside ``model`` by ``Fp8Linear.from_linear``, and every eligible set of
    experts in transformers' fused 3-D form (:func:`is_fused_experts`) by ``Fp8Experts``, in place.

    Experts are eligible with SiLU-gated [gate; up] weights, no bias, H and I multiples of 128 and float weights;
    the model's own MoE block then calls the ``Fp8Experts`` with its routing, unchanged.

    A transformers FP8 model (``FineGrainedFP8Config``, or an FP8 checkpoint it loads) has its ``FP8Linear`` and
    ``FP8Experts`` swapped for ``Fp8Linear`` and ``Fp8Experts`` holding the same FP8 weights and scales: nothing is
    quantized again, and the outputs are those of transformers' FP8 route on ``fp8gemm.hf``, without transformers'
    per-call Python (docs/transformers.md). Static activation scales, other block sizes and FP4 weights stay.

    Eligible: a plain ``nn.Linear`` (not a subclass) with in_features % 128 == 0, out_features % 16
    == 0 and an untied bf16/fp16/fp32 weight, whose qualified name ``skip`` does not match. ``skip``
    is a collection of names (``"lm_head"`` matches ``lm_head`` and ``model.lm_head``), or a
    predicate ``(name, module) -> bool``; the default keeps ``lm_head`` in full precision. Pass
    ``skip=()`` to convert it too. A model on the meta device gets empty layers (a skeleton for
    ``load_fp8_checkpoint``). Returns a :class:`ConversionReport`, like ``load_state_dict`` returns
    its missing and unexpected keys.

    ``training=True``: each eligible plain ``nn.Linear`` becomes an ``Fp8TrainingLinear`` holding the same weight and
    bias Parameters (FP8 forward and backward GEMMs, docs/training.md); eligible means in_features and out_features
    multiples of 128, an untied float weight and not matched by ``skip``. Eligible fused experts (as above, their
    weights Parameters) become an ``Fp8TrainingExperts`` holding the same ``gate_up_proj`` and ``down_proj``. Every
    other layer stays as it is, in its own precision, with the reason in the report; transformers' FP8 modules are
    not converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if training and fp8_dtype is not None:
        raise ValueError("fp8_dtype is for inference layers; training=True quantizes to the FP8 dtype of each device")
    if isinstance(model, nn.Linear):
        raise TypeError("model is itself an nn.Linear and cannot be replaced in place; use Fp8Linear.from_linear")
    skipped_by = _skip_matcher(skip)
    owners = _parameter_owners(model)
    report = ConversionReport([], {})
    done: dict[int, nn.Module] = {}  # a layer reachable under two names is converted (or kept) once
    kept: dict[int, str] = {}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):  # named_children() hides a second name
            kind = _kind(child)
            if kind is None:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in kept:
                report.skipped[name] = kept[id(child)]
                continue
            if id(child) not in done:
                reason = skipped_by(name, child) or _reason_to_keep(kind, child, owners, training)
                if reason:
                    report.skipped[name] = kept[id(child)] = reason
                    continue
                done[id(child)] = _replacement(kind, child, fp8_dtype, pow2_scales, training)
            setattr(parent, child_name, done[id(child)])
            report.converted.append(name)
    if any(next(itertools.chain(layer.buffers(), layer.parameters())).device.type == "cpu" for layer in done.values()):
        warnings.warn(
            "fp8gemm.nn.convert: the converted layers are on CPU, where fp8gemm runs its pure-torch reference, which "
            "is for checking numbers and is tens of times slower than the bf16 layers; move the model to a GPU with "
            "its fp8gemm package installed for speed",
            ReferenceOnCpuWarning,
            stacklevel=2,
        )
    return report
