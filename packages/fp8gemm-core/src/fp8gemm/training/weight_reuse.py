"""``reuse_quantized_weights()``: each master weight quantized once for every forward in a block of code.

With gradient accumulation an optimizer step runs several micro-batches on the same weights, and every forward of
``fp8gemm.training.linear`` and ``fused_experts`` would quantize them again (with their transposes: a read of the
high-precision weight and two FP8 writes). Inside ``with reuse_quantized_weights():`` the first forward of a weight
keeps its FP8 copies and the later ones reuse them. A weight is quantized again when it is another tensor, or the same
one changed in place (its version counter: optimizers and ``copy_`` under ``no_grad`` bump it), or with another FP8
dtype or scale rounding. The copies are dropped when the block ends.

What the version counter cannot see, the caller must not do inside the block: write a weight through ``.data`` (a
tensor that shares its memory but not its counter). Compiled code and CUDA-graph captures quantize on every call (a
cache is a side effect neither keeps), and so does a forward recomputed in the backward (activation checkpointing:
the autograd engine's thread does not see the block).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")

# id(weight) -> (the weight itself, what its copies were made from, the copies); None outside a block
_BLOCK: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fp8gemm_quantized_weights", default=None)


@contextlib.contextmanager
def reuse_quantized_weights() -> Iterator[None]:
    """Quantize each master weight once for every forward inside the block (module docstring). Nested blocks share
    the outermost one's copies."""
    if _BLOCK.get() is not None:
        yield
        return
    token = _BLOCK.set({})
    try:
        yield
    finally:
        _BLOCK.reset(token)


def reusing(weight: torch.Tensor) -> bool:
    """Whether a forward on ``weight`` here keeps or reuses its quantized copies (inside a block, eager, uncaptured)."""
    if torch.compiler.is_compiling() or _BLOCK.get() is None:  # compiling first: the context lookup is not traced
        return False
    return not (weight.is_cuda and torch.cuda.is_current_stream_capturing())


def _made_from(weight: torch.Tensor, how: tuple) -> tuple:
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype, weight.device, how)


def quantized_once(weight: torch.Tensor, how: tuple, quantize: Callable[[], T]) -> T:
    """``quantize()``, or inside a block the copies an earlier call made of this weight, unchanged since, the same
    way (``how``: every argument of the quantizer other than the weight)."""
    if not reusing(weight):
        return quantize()
    block = _BLOCK.get()
    made_from = _made_from(weight, how)
    entry = block.get(id(weight))
    if entry is not None and entry[0] is weight and entry[1] == made_from:
        return entry[2]
    copies = quantize()
    block[id(weight)] = (weight, made_from, copies)  # the weight held: its id is not reused while the block lasts
    return copies
