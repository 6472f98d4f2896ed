"""What every op needs at run time, in one place: the tensors' device and its current stream, scratch memory kept
per (device, stream), the backend that runs on a device, the operand layout kernels read in place, and the
refusal of autograd (no op has a backward).

``ops``, ``quantize``, ``linear`` and the grouped ops use these public names; nothing else in the core reaches
into another module's private helpers.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

import torch

from . import registry
from .protocol import IN_BF16, IN_FP16, IN_FP32, OUT_BF16, OUT_FP32
from .reference import REFERENCE
from .validation import ld_reader

LIBRARY = "fp8gemm"  # the torch.library namespace of every op; a vendored copy of the core renames it
IN_KINDS = {torch.bfloat16: IN_BF16, torch.float16: IN_FP16, torch.float32: IN_FP32}

device_index = torch.Tensor.get_device  # -1 on CPU; the unbound method: no wrapper call per tensor
capturing = torch.cuda.is_current_stream_capturing


def current_device() -> int:
    return torch._C._cuda_getDevice()


def raw_stream(index: int) -> int:
    """The current ``cudaStream_t`` (a ``hipStream_t`` under ROCm torch) of device ``index``."""
    return torch._C._cuda_getCurrentRawStream(index)


def on_device(device: torch.device):
    """Kernels launch on the current device: switch to the tensors' device only when it is another one."""
    here = current_device()
    if device.index == here:
        return contextlib.nullcontext()
    if capturing():  # a launch on the tensors' device would run now, outside the graph being captured here
        raise RuntimeError(
            f"a CUDA graph is being captured on cuda:{here}, but the tensors are on {device}: their kernels would run "
            f"outside the graph. Capture on the tensors' device: torch.cuda.graph(g, stream=torch.cuda.Stream({device}))"
        )
    return torch.cuda.device(device)


def out_kind(dtype: torch.dtype) -> int:
    return OUT_FP32 if dtype is torch.float32 else OUT_BF16


def requested_backend(name: str | None) -> str | None:
    """``backend=`` as the caller passed it, else ``$FP8GEMM_BACKEND``, else None (the best fit)."""
    return name or os.environ.get(registry.ENV_VAR) or None


# --- autograd: no op has a backward, so none may take part in a graph that will be differentiated -------


def grad_error(op: str, name: str) -> RuntimeError:
    return RuntimeError(
        f"fp8gemm.{op} has no backward, and {name} requires grad: a gradient through it would be wrong. Run "
        f"inference under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
    )


grad_enabled = torch.is_grad_enabled


def refuse_grad(op: str, names: tuple[str, ...], tensors: tuple) -> None:
    """Raise when grad mode is on and any of ``tensors`` requires grad (None and non-tensors are skipped)."""
    if torch.is_grad_enabled():
        for name, t in zip(names, tensors, strict=False):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise grad_error(op, name)


# --- the torch.library ops ------------------------------------------------------------------------------------

_library = torch.library.Library(LIBRARY, "FRAGMENT")
_infer_schema = getattr(torch.library, "infer_schema", None) or torch._library.infer_schema.infer_schema  # torch 2.4


class Op:
    """``fn`` (annotated as for ``torch.library.custom_op``) as the op ``torch.ops.<LIBRARY>.<name>``, registered with
    the low-level ``torch.library`` API: custom_op's per-call wrappers cost a compiled model 44 us per call on an H100
    host (docs/benchmarks.md, "Host overhead"). Its autograd kernel refuses an input that requires grad (no op has a
    backward), then runs the op below autograd and bumps the version of every tensor it writes."""

    def __init__(self, name: str, fn, public: str, arg_names: tuple[str, ...], mutates_args: tuple[str, ...]):
        self.qualname = f"{LIBRARY}::{name}"
        _library.define(name + _infer_schema(fn, mutates_args=mutates_args))
        _library.impl(name, fn, "CompositeExplicitAutograd")
        overload = getattr(getattr(torch.ops, LIBRARY), name).default
        written = [i for i, a in enumerate(overload._schema.arguments) if a.alias_info and a.alias_info.is_write]

        def autograd_kernel(*args):
            refuse_grad(public, arg_names, args)
            with torch._C._AutoDispatchBelowADInplaceOrView():
                result = overload(*args)
            for i in written:
                torch.autograd.graph.increment_version(args[i])
            return result

        _library.impl(name, autograd_kernel, "Autograd")

    def register_fake(self, fn):
        torch.library.register_fake(self.qualname, fn, lib=_library)
        return fn


def op(name: str, public: str, arg_names: tuple[str, ...], mutates_args: tuple[str, ...] = ()):
    """Decorator: the function becomes ``torch.ops.<LIBRARY>.<name>`` (:class:`Op`); ``public`` and ``arg_names``
    name the entry point and its tensors in the grad refusal."""
    return lambda fn: Op(name, fn, public, arg_names, mutates_args)


# --- the backend for a device, as the steady-state call needs it ---------------------------------------------


class FastBackend(NamedTuple):
    """A GPU backend with what a steady-state call reads of it, looked up once per (device, requested name)."""

    backend: object
    fp8_dtype: torch.dtype
    read_a_scale_ld: object  # validation.ld_reader of its a_scale layout
    read_b_scale_ld: object


_fast_backends: dict[tuple[int, str | None], FastBackend | None] = {}
registry.on_refresh(_fast_backends.clear)


def fast_backend(index: int, requested: str | None) -> FastBackend | None:
    """The backend for CUDA/ROCm device ``index`` (``requested``: a name, or None for the best fit); None where
    the reference runs."""
    key = (index, requested)
    if key not in _fast_backends:
        chosen = registry.select(torch.device("cuda", index), requested).backend
        _fast_backends[key] = (
            None
            if chosen is REFERENCE
            else FastBackend(
                chosen,
                getattr(torch, chosen.fp8_dtype),
                ld_reader(chosen.a_scale_layout),
                ld_reader(chosen.b_scale_layout),
            )
        )
    return _fast_backends[key]


def weight_lds(found: FastBackend, b, b_scale, k: int, dev: int):
    """``(ldb, b_scale_ld)`` where the kernel can read the weight ``b`` [N, K] (2-D, the backend's FP8 dtype:
    the caller checked) and its scale in place on device ``dev``; None sends the call to the checked path."""
    if type(b_scale) is not torch.Tensor or b_scale.dtype is not torch.float32:
        return None
    if (b.requires_grad or b_scale.requires_grad) and grad_enabled():  # the checked path refuses them
        return None
    n, b_k = b.shape
    kb, nb = k >> 7, (n + 127) >> 7
    if b_k != k or not n or n & 15 or b_scale.shape != (nb, kb):
        return None
    ldb, b1 = b.stride()
    if b1 != 1 or ldb < k or ldb & 15:
        return None
    b_scale_ld = found.read_b_scale_ld(b_scale.stride(), nb, kb)
    if b_scale_ld is None or device_index(b) != dev or device_index(b_scale) != dev:
        return None
    if (b.data_ptr() | b_scale.data_ptr()) & 15:
        return None
    return ldb, b_scale_ld


def kernel_rows(x2d: torch.Tensor) -> torch.Tensor:
    """``x2d`` if a kernel can read it in place (unit column stride, 16-byte aligned rows), else a contiguous copy."""
    size = x2d.element_size()
    if x2d.stride(1) == 1 and (x2d.stride(0) * size) % 16 == 0 and x2d.data_ptr() % 16 == 0:
        return x2d
    return x2d.clone(memory_format=torch.contiguous_format)


# --- scratch memory -------------------------------------------------------------------------------------------

# Scratch up to this size (split-K partial sums, the FP8 copy of a decode step's activations) is kept per
# (device, stream): one allocation less per call, ~2 us of host time. Kernels on one stream run in order, so a
# kept buffer is never written while an earlier kernel reads it; under graph capture every call allocates, as a
# graph must own its memory. A buffer is kept only if it came from the allocator's default pool: a private pool
# (torch.compile's CUDA-graph warm-up, a user's MemPool) may hand its memory to a graph whose replays overwrite
# it, and torch.compile refuses a pool holding tensors it does not track. Streams are keyed with their device:
# every device's default stream is handle 0.
SCRATCH_KEPT_BYTES = 1 << 20
_kept_scratch: dict[tuple[int, int], tuple[torch.Tensor, int] | None] = {}  # None: this stream keeps none
registry.on_refresh(_kept_scratch.clear)


def scratch(nbytes: int, device: torch.device, stream: int) -> int:
    """The device address of ``nbytes`` of scratch for kernels launched next on ``stream`` of ``device``."""
    if not nbytes:
        return 0
    if nbytes <= SCRATCH_KEPT_BYTES and not capturing():
        key = (device.index, stream)
        kept = _kept_scratch.get(key, False)
        if kept is False:
            buffer = torch.empty(SCRATCH_KEPT_BYTES, dtype=torch.uint8, device=device)
            kept = _kept_scratch[key] = (buffer, buffer.data_ptr()) if in_default_pool(buffer) else None
        if kept is not None:
            return kept[1]
    return torch.empty(nbytes, dtype=torch.uint8, device=device).data_ptr()  # freed to this stream, in order


def in_default_pool(buffer: torch.Tensor) -> bool:
    """Whether ``buffer`` lies in a segment of the caching allocator's default pool (asked once per stream: the
    allocator's snapshot walks every segment)."""
    if buffer.device.type != "cuda":
        return True
    address = buffer.data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return tuple(segment["segment_pool_id"]) == (0, 0)
    return False


def kept_scratch_addresses() -> dict[tuple[int, int], int]:
    """(device, stream) -> address of its kept scratch buffer (for tests and diagnostics)."""
    return {key: kept[1] for key, kept in _kept_scratch.items() if kept is not None}
