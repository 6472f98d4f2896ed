"""Per-expert checkpoint tensors stacked into fused experts while a checkpoint loads.

FP8 checkpoints (DeepSeek-V3, Qwen3-MoE-FP8) store each routed expert as three linear layers,
``<experts>.{e}.gate_proj.weight`` / ``up_proj`` / ``down_proj`` with their ``weight_scale_inv``; a converted model
holds them as one ``Fp8Experts`` (``w13`` = [gate; up] per expert, ``w2`` = down), and a model left in bf16 as
transformers' fused ``gate_up_proj`` / ``down_proj`` parameters. Each projection is copied into its rows as its shard
is read, so no shard waits for the others.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..reference import FP8_DTYPES
from .convert import is_fused_experts
from .experts import ALIASES, Fp8Experts

EXPERT_KEY = re.compile(r"^(?P<experts>.+)\.(?P<index>\d+)\.(?P<projection>gate_proj|up_proj|down_proj)\."
                        r"(?P<tensor>weight|weight_scale_inv)$")  # fmt: skip
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _dequantized(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is None or weight.dtype not in FP8_DTYPES:
        if scale is not None:
            raise TypeError(f"a weight_scale_inv comes with a {weight.dtype} weight; a scaled weight must be FP8")
        return weight.to(dtype)
    n, k = weight.shape
    per_element = scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return (weight.float() * per_element).to(dtype)


def _into_fused_parameters(experts: nn.Module, index: int, projection: str, weight, scale) -> None:
    """A bf16 model's fused experts (left alone by ``convert``): the projection dequantized into its rows."""
    inter = experts.gate_up_proj.shape[1] // 2
    if projection == "down_proj":
        target = experts.down_proj[index]
    else:
        target = (
            experts.gate_up_proj[index, :inter] if projection == "gate_proj" else experts.gate_up_proj[index, inter:]
        )
    if tuple(weight.shape) != tuple(target.shape):
        raise ValueError(f"shape {tuple(weight.shape)} in the checkpoint, the experts take {list(target.shape)}")
    with torch.no_grad():
        target.copy_(_dequantized(weight, scale, target.dtype))


class ExpertStacks:
    """The model's fused experts and which (expert, projection) of each a checkpoint has filled so far."""

    def __init__(self, model: nn.Module, device: str):
        self.modules = {
            name: m for name, m in model.named_modules() if isinstance(m, Fp8Experts) or is_fused_experts(m)
        }
        self.filled: dict[str, set[tuple[int, str]]] = {name: set() for name in self.modules}
        self.device = device

    def _size(self, name: str) -> int:
        module = self.modules[name]
        return module.num_experts if isinstance(module, Fp8Experts) else module.gate_up_proj.shape[0]

    def take(self, batch: dict[str, torch.Tensor]) -> list[str]:
        """Load and remove from ``batch`` the per-expert tensors of the model's experts; returns the keys of experts
        past E (unexpected)."""
        groups: dict[tuple[str, int, str], dict[str, torch.Tensor]] = {}
        unexpected = []
        for key in list(batch):
            match = EXPERT_KEY.match(key)
            if match is None or match["experts"] not in self.modules:
                continue
            tensor = batch.pop(key)
            if int(match["index"]) >= self._size(match["experts"]):
                unexpected.append(key)
                continue
            groups.setdefault((match["experts"], int(match["index"]), match["projection"]), {})[match["tensor"]] = (
                tensor
            )
        for (name, index, projection), tensors in groups.items():
            module = self.modules[name]
            if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
                module.to_empty(device=self.device)  # a skeleton: filled expert by expert from here
            where = f"{name}.{index}.{projection}"
            if "weight" not in tensors:
                raise RuntimeError(f"{where}.weight_scale_inv comes without {where}.weight")
            try:
                if isinstance(module, Fp8Experts):
                    module.load_expert(index, projection, tensors["weight"], tensors.get("weight_scale_inv"))
                else:
                    _into_fused_parameters(
                        module, index, projection, tensors["weight"], tensors.get("weight_scale_inv")
                    )
            except (TypeError, ValueError) as exc:
                raise RuntimeError(f"Error(s) in loading {where}: {exc}") from exc
            self.filled[name].add((index, projection))
        return unexpected

    def covered(self, seen: set[str]) -> set[str]:
        """The model's state-dict keys of every fully stacked experts module, and of an ``Fp8Experts`` loaded by its
        fused names (``w13`` or transformers' ``gate_up_proj``: a float one is quantized on load, its scale made)."""
        keys = set()
        for name, module in self.modules.items():
            own = [f"{name}.{key}" for key in module.state_dict()]
            if len(self.filled[name]) == 3 * self._size(name):
                keys.update(own)
            elif isinstance(module, Fp8Experts):
                for alias, buffer in ALIASES.items():
                    if f"{name}.{alias}" in seen or f"{name}.{buffer}" in seen:
                        keys.update({f"{name}.{buffer}", f"{name}.{buffer}_scale_inv"})
        return keys

    def missing(self) -> tuple[set[str], list[str]]:
        """(the state-dict keys that partly stacked modules stand for, the per-expert keys they still lack)."""
        replaced, lacking = set(), []
        for name, module in self.modules.items():
            if not self.filled[name] or len(self.filled[name]) == 3 * self._size(name):
                continue
            replaced.update(f"{name}.{key}" for key in module.state_dict())
            lacking += [f"{name}.{e}.{p}.weight" for e in range(self._size(name)) for p in _PROJECTIONS
                        if (e, p) not in self.filled[name]]  # fmt: skip
        return replaced, lacking
