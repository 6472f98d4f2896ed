"""Loading FP8 checkpoints (DeepSeek-V3 / Qwen3-FP8 format, safetensors) into a converted model."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ..reference import BLOCK, FP8_DTYPES
from .checkpoint_experts import ExpertStacks
from .layer import Fp8Linear

PathLike = str | os.PathLike
_SCALE_SUFFIX = ".weight_scale_inv"
_INDEX_NAME = "model.safetensors.index.json"


def checkpoint_files(path_or_paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """A safetensors file, a list of them, or a folder (its index's shards, else every *.safetensors)."""
    if not isinstance(path_or_paths, (str, os.PathLike)):
        files = [Path(p) for p in path_or_paths]
    elif Path(path_or_paths).is_dir():
        folder = Path(path_or_paths)
        index = folder / _INDEX_NAME
        if index.is_file():
            files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in {folder}")
    else:
        files = [Path(path_or_paths)]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint file {f} does not exist")
    return files


def _owner(key: str) -> str:
    return key.rpartition(".")[0]


def _dequantized(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n, k = weight.shape
    per_element = scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    return (weight.float() * per_element).to(dtype)


def _dequantize_for_plain_layers(model: nn.Module, batch: dict[str, torch.Tensor]) -> None:
    """FP8 weights whose module stayed a float layer (skipped by ``convert``) are dequantized into it."""
    for scale_key in [key for key in batch if key.endswith(_SCALE_SUFFIX)]:
        owner = scale_key[: -len(_SCALE_SUFFIX)]
        weight_key = owner + ".weight"
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue  # not in the model: reported as unexpected
        weight = batch.get(weight_key)
        if isinstance(module, Fp8Linear) or weight is None or weight.dtype not in FP8_DTYPES:
            continue
        current = getattr(module, "weight", None)
        dtype = current.dtype if isinstance(current, torch.Tensor) and current.dtype not in FP8_DTYPES else None
        batch[weight_key] = _dequantized(weight, batch.pop(scale_key), dtype or torch.bfloat16)


def _scales_made_on_load(model: nn.Module, batch: dict[str, torch.Tensor]) -> set[str]:
    """The ``weight_scale_inv`` keys of converted layers whose checkpoint weight is floating point: ``Fp8Linear``
    quantizes such a weight on load (as ``load_state_dict`` does), so its scale is not missing."""
    made = set()
    for key, tensor in batch.items():
        if not key.endswith(".weight") or tensor.dtype in FP8_DTYPES or not tensor.dtype.is_floating_point:
            continue
        owner = key[: -len(".weight")]
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue
        if isinstance(module, Fp8Linear) and owner + _SCALE_SUFFIX not in batch:
            made.add(owner + _SCALE_SUFFIX)
    return made


def _has_meta_tensors(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def load_fp8_checkpoint(
    model: nn.Module,
    path_or_paths: PathLike | Iterable[PathLike],
    *,
    device: torch.device | str | None = None,
    strict: bool = True,
):
    """Load safetensors checkpoint files into ``model`` (usually converted by ``fp8gemm.nn.convert``).

    Each module's tensors are loaded together, shard by shard, through ``model.load_state_dict``,
    so ``Fp8Linear`` does the format work: e4m3fn -> the layer's FP8 dtype, scale layout for its
    device. FP8 weights of layers that stayed ``nn.Linear`` are dequantized into them; a bf16/fp16/fp32 weight of
    a converted layer is quantized on load (``fp8gemm.quantize_weight``), as ``load_state_dict`` does. A model with
    meta tensors (a skeleton built under ``torch.device("meta")``) is filled by assignment, on
    ``device`` (default CPU); otherwise tensors are copied into the existing ones. Per-expert tensors
    (``<experts>.{e}.gate_proj.weight`` + ``weight_scale_inv``, ``up_proj``, ``down_proj``) are stacked into the
    model's ``Fp8Experts`` (or, dequantized, into experts left in bf16) as each shard is read.
    Returns ``(missing_keys, unexpected_keys)`` like ``load_state_dict``; ``strict`` raises if any.
    """
    try:
        from safetensors import safe_open  # an optional dependency: only checkpoint loading needs it
    except ImportError as exc:
        raise ImportError("load_fp8_checkpoint needs safetensors: pip install 'fp8gemm-core[checkpoint]'") from exc

    files = checkpoint_files(path_or_paths)
    assign = _has_meta_tensors(model)
    load_device = str(torch.device(device)) if device is not None else "cpu"
    siblings: Counter[str] = Counter()
    for f in files:
        with safe_open(f, framework="pt") as handle:
            siblings.update(_owner(key) for key in handle.keys())
    expected = set(model.state_dict().keys())
    stacks = ExpertStacks(model, load_device)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    seen: set[str] = set()
    unexpected: list[str] = []
    for f in files:
        ready: dict[str, torch.Tensor] = {}
        with safe_open(f, framework="pt", device=load_device) as handle:
            for key in handle.keys():
                group = pending.setdefault(_owner(key), {})
                group[key] = handle.get_tensor(key)
                if len(group) == siblings[_owner(key)]:  # a module whose tensors span shards waits for all
                    ready.update(pending.pop(_owner(key)))
        unexpected += stacks.take(ready)
        seen.update(ready)
        seen.update(_scales_made_on_load(model, ready))
        _dequantize_for_plain_layers(model, ready)
        unexpected += model.load_state_dict(ready, strict=False, assign=assign).unexpected_keys
    partly_stacked, lacking = stacks.missing()
    missing = sorted(expected - seen - stacks.covered(seen) - partly_stacked) + lacking
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"checkpoint and model disagree: missing {missing[:10]}{' ...' if len(missing) > 10 else ''}, "
            f"unexpected {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}; pass strict=False to "
            f"load what matches"
        )
    return nn.modules.module._IncompatibleKeys(missing, unexpected)
