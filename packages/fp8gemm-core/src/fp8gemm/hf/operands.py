"""transformers' FP8 weights and scales as fp8gemm reads them, checked and converted once per weight.

transformers hands its parameters to the kernel on every call: FP8 weights that require grad (``nn.Parameter``), and
scales as the checkpoint stores them (fp32 or UE8M0, row-major). Checking them and converting the scale into the
backend's layout (``prepare_weight_scale``; UE8M0 to fp32) is done on a weight's first call and kept, keyed by what
can change between calls: a reload (``.to()``, ``load_state_dict``, ``param.data = ...``) gives a new address, shape
or stride, an in-place write into a converted scale a new version; then it is done again. What is kept is in no
``state_dict``.
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch

from .. import registry, runtime
from ..nn.layer import prepared_scale


def stamp(t: torch.Tensor, copied: bool) -> tuple:
    """What changes when a tensor is reloaded (address, shape, strides, dtype) and, for one kept as a ``copied``
    conversion, written in place (its version; a tensor read in place needs none: the write is read)."""
    where = t.data_ptr(), t.shape, t.stride(), t.dtype
    return (*where, None if t.is_inference() else t._version) if copied else where  # an inference tensor: no counter


def copied(source: torch.Tensor, ready: torch.Tensor) -> bool:
    """Whether ``ready`` (from :func:`backend_scale`) is a copy of ``source``, not ``source`` read in place."""
    return ready.data_ptr() != source.data_ptr()


def backend_scale(scale: torch.Tensor) -> torch.Tensor:
    """A weight scale (fp32 or UE8M0, [.., N/128, K/128]) as fp32 in the layout the backend for its device reads."""
    scale = scale.detach()
    if scale.dtype != torch.float32:
        scale = scale.float()  # UE8M0 (scale_fmt="ue8m0"): powers of two, exact in fp32
    return prepared_scale(scale)


def may_keep(source: torch.Tensor, ready: torch.Tensor) -> bool:
    """Whether ``ready`` (made from ``source`` by :func:`backend_scale`) may serve later calls. A copy may not when
    its source keeps no version (an in-place write would go unseen), nor while a CUDA graph is being captured (the
    graph's own kernels make the copy, and have not run yet)."""
    if not copied(source, ready):
        return True  # the source itself, read in place: later writes to it are read too
    return not source.is_inference() and not (ready.is_cuda and runtime.capturing())


class Kept(NamedTuple):
    weight: weakref.ref
    scale: torch.Tensor  # the caller's scale tensor, compared by identity
    call: tuple  # (dims, block_size) of the call that checked them
    copied: bool  # the scale kept is a conversion of the caller's
    stamps: tuple
    operands: tuple[torch.Tensor, torch.Tensor]


_kept: dict[int, Kept] = {}  # id(weight) -> its checked operands
registry.on_refresh(_kept.clear)  # another backend may want another layout


def _forget(key: int, ref: weakref.ref) -> None:
    kept = _kept.get(key)
    if kept is not None and kept.weight is ref:
        del _kept[key]


def kept_operands(weight, weight_scale_inv, call: tuple) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The operands kept for exactly these tensors in their present state and this ``call`` (dims, block size), or
    None."""
    kept = _kept.get(id(weight))
    if kept is None or kept.weight() is not weight or kept.scale is not weight_scale_inv or kept.call != call:
        return None
    return kept.operands if kept.stamps == (stamp(weight, False), stamp(weight_scale_inv, kept.copied)) else None


def keep(weight, weight_scale_inv, call: tuple, operands: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Keep ``operands`` (the detached weight, the scale from :func:`backend_scale`) for later calls like ``call``,
    when allowed; forgotten when the weight is freed."""
    if not may_keep(weight_scale_inv, operands[1]):
        return
    key = id(weight)
    ref = weakref.ref(weight, functools.partial(_forget, key))
    call = tuple(list(c) if isinstance(c, list) else c for c in call)  # a copy: the caller's list may change
    copy = copied(weight_scale_inv, operands[1])
    _kept[key] = Kept(
        ref, weight_scale_inv, call, copy, (stamp(weight, False), stamp(weight_scale_inv, copy)), operands
    )
