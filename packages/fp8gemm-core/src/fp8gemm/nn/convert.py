"""``convert``: swap a model's eligible ``nn.Linear`` layers for ``Fp8Linear``, in place."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import nn

from .layer import Fp8Linear, check_linear_shape

SkipRule = Iterable[str] | Callable[[str, nn.Module], bool]

# Hugging Face's FP8 quantizers keep the output projection in full precision (the last, tied or
# output-embedding module), as vLLM and the FP8 checkpoints themselves do: logits are the most
# sensitive product, and with a large vocabulary lm_head is one layer among hundreds.
DEFAULT_SKIP = ("lm_head",)


class ReferenceOnCpuWarning(UserWarning):
    """Converted layers on CPU run fp8gemm's pure-torch reference: right numbers, far slower than bf16."""


class ConversionReport(NamedTuple):
    """What ``convert`` did: qualified names converted, and the ``nn.Linear`` layers left alone with why."""

    converted: list[str]
    skipped: dict[str, str]

    def __str__(self) -> str:
        lines = [f"{len(self.converted)} nn.Linear layers converted to Fp8Linear, {len(self.skipped)} left alone"]
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


def _reason_to_keep(name: str, linear: nn.Module, skipped_by, owners) -> str | None:
    if type(linear) is not nn.Linear:  # e.g. MultiheadAttention's out_proj, whose owner reads .weight directly
        return f"{type(linear).__name__} is a subclass of nn.Linear; only plain nn.Linear is converted"
    reason = skipped_by(name, linear) or check_linear_shape(linear.in_features, linear.out_features)
    if reason:
        return reason
    if linear.weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"weight dtype {linear.weight.dtype} is not bfloat16/float16/float32"
    sharers = [n for module_id, n in owners.get(id(linear.weight), {}).items() if module_id != id(linear)]
    if sharers:
        return f"weight tied to {', '.join(sharers)}"
    return None


def convert(
    model: nn.Module,
    *,
    skip: SkipRule = DEFAULT_SKIP,
    fp8_dtype: torch.dtype | None = None,
    pow2_scales: bool = False,
) -> ConversionReport:
    """Replace every eligible ``nn.Linear`` inside ``model`` by ``Fp8Linear.from_linear``, in place.

    Eligible: a plain ``nn.Linear`` (not a subclass) with in_features % 128 == 0, out_features % 16
    == 0 and an untied bf16/fp16/fp32 weight, whose qualified name ``skip`` does not match. ``skip``
    is a collection of names (``"lm_head"`` matches ``lm_head`` and ``model.lm_head``), or a
    predicate ``(name, module) -> bool``; the default keeps ``lm_head`` in full precision. Pass
    ``skip=()`` to convert it too. A model on the meta device gets empty layers (a skeleton for
    ``load_fp8_checkpoint``). Returns a :class:`ConversionReport`, like ``load_state_dict`` returns
    its missing and unexpected keys.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Linear):
        raise TypeError("model is itself an nn.Linear and cannot be replaced in place; use Fp8Linear.from_linear")
    skipped_by = _skip_matcher(skip)
    owners = _parameter_owners(model)
    report = ConversionReport([], {})
    done: dict[int, Fp8Linear] = {}  # a layer reachable under two names is converted (or kept) once
    kept: dict[int, str] = {}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):  # named_children() hides a second name
            if not isinstance(child, nn.Linear):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in kept:
                report.skipped[name] = kept[id(child)]
                continue
            if id(child) not in done:
                reason = _reason_to_keep(name, child, skipped_by, owners)
                if reason:
                    report.skipped[name] = kept[id(child)] = reason
                    continue
                done[id(child)] = Fp8Linear.from_linear(child, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)
            setattr(parent, child_name, done[id(child)])
            report.converted.append(name)
    if any(layer.weight.device.type == "cpu" for layer in done.values()):
        warnings.warn(
            "fp8gemm.nn.convert: the converted layers are on CPU, where fp8gemm runs its pure-torch reference, which "
            "is for checking numbers and is tens of times slower than the bf16 layers; move the model to a GPU with "
            "its fp8gemm package installed for speed",
            ReferenceOnCpuWarning,
            stacklevel=2,
        )
    return report
