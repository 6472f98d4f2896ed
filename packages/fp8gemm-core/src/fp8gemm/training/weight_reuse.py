"""``reuse_quantized_weights()``: each master weight quantized once for every forward in a block of code.

With gradient accumulation an optimizer step runs several micro-batches on the same weights, and every forward of
``fp8gemm.training.linear`` and ``fused_experts`` would quantize them again (with their transposes: a read of the
high-precision weight and two FP8 writes). Inside ``with reuse_quantized_weights():`` the first forward of a weight
keeps its FP8 copies and the later ones reuse them. A weight is quantized again when it is another tensor, or the same
one changed in place where its version counter sees it (``copy_`` under ``no_grad``, ``load_state_dict``, torch's
for-loop and foreach optimizers), or moved, or with another FP8 dtype or scale rounding; every ``torch.optim`` step
drops all copies (fused optimizers leave the version counter alone). The copies go when the block ends.

What neither sees, the caller must keep out of the block: an optimizer other than ``torch.optim``'s stepping
inside it, writes through ``.data``, FSDP2's gathers (they keep the counter on purpose). Non-leaf weights (a cast
inside the forward, a parametrization) are quantized on every call, as are compiled code, CUDA-graph captures and
forwards recomputed on the autograd engine's thread (activation checkpointing on a GPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

T = TypeVar("T")

# weight -> (what its copies were made from, the copies), held weakly: an entry goes with its weight
_BLOCK: contextvars.ContextVar[WeakIdKeyDictionary | None] = contextvars.ContextVar(
    "fp8gemm_quantized_weights", default=None
)
_OPEN: list[WeakIdKeyDictionary] = []  # every open block, in any thread: an optimizer step empties them all
_STEP_HOOK: list = []  # the optimizer step hook's handle while any block is open
_LOCK = threading.Lock()  # blocks open and close in any thread


def _drop_every_copy(optimizer, args, kwargs) -> None:
    with _LOCK:
        for block in _OPEN:
            block.clear()


@contextlib.contextmanager
def reuse_quantized_weights() -> Iterator[None]:
    """Quantize each master weight once for every forward inside the block (module docstring). Nested blocks share
    the outermost one's copies."""
    if _BLOCK.get() is not None:
        yield
        return
    block = WeakIdKeyDictionary()
    token = _BLOCK.set(block)
    with _LOCK:
        _OPEN.append(block)
        if not _STEP_HOOK:
            _STEP_HOOK.append(register_optimizer_step_post_hook(_drop_every_copy))
    try:
        yield
    finally:
        _BLOCK.reset(token)
        with _LOCK:
            _OPEN.remove(block)
            if not _OPEN:
                _STEP_HOOK.pop().remove()


def reusing(weight: torch.Tensor) -> bool:
    """Whether a forward on ``weight`` here keeps or reuses its quantized copies: inside a block, eager, uncaptured,
    and a leaf (a weight computed in the forward is new on every call)."""
    if torch.compiler.is_compiling() or _BLOCK.get() is None:  # compiling first: the context lookup is not traced
        return False
    if weight.grad_fn is not None:
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
    entry = block.get(weight)
    if entry is not None and entry[0] == made_from:
        return entry[1]
    copies = quantize()
    block[weight] = (made_from, copies)
    return copies
