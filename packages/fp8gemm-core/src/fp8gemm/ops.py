"""``fp8gemm.gemm``: validation, backend dispatch, and the torch.library ops for torch.compile."""

from __future__ import annotations

import contextlib
import os

import torch

from . import registry
from .protocol import OUT_BF16, OUT_FP32, Backend
from .reference import REFERENCE, reference_gemm
from .validation import check_inputs, check_tensor, conform_scale, ld_reader

_device_index = torch.Tensor.get_device  # -1 on CPU; the unbound method: no wrapper call per tensor


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def _raw_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)  # a hipStream_t under ROCm torch


def _device_guard(device: torch.device):
    """Kernels launch on the current device: switch only when the tensors live elsewhere."""
    return contextlib.nullcontext() if device.index == _current_device() else torch.cuda.device(device)


# --- fast path: the steady-state call (valid inputs, scales already in the backend's layout) ---------
# A serving engine calls gemm thousands of times per second with the same metadata, and the general
# path below spends ~20 Python-level checks on it. The fast path tests the same conditions with the
# fewest tensor-attribute reads and gives up (returns None) on anything unusual; the general path
# then validates in full and produces the error message. It never accepts what the general path
# rejects (tests/test_registry.py and the GPU suite check both paths).

_fast_backends: dict[tuple[int, str | None], tuple | None] = {}
registry.on_refresh(_fast_backends.clear)


def _fast_backend(device_index: int, requested: str | None):
    key = (device_index, requested)
    if key not in _fast_backends:
        chosen = registry.select(torch.device("cuda", device_index), requested).backend
        _fast_backends[key] = (
            None
            if chosen is REFERENCE
            else (
                chosen,
                getattr(torch, chosen.fp8_dtype),
                ld_reader(chosen.a_scale_layout),
                ld_reader(chosen.b_scale_layout),
            )
        )
    return _fast_backends[key]


def _fast_weight(read_b_scale_ld, b, b_scale, k: int, dev: int):
    """``(ldb, b_scale_ld)`` where the kernel reads the weight ``b`` [N, K] (a 2-D tensor in the backend's FP8
    dtype: the caller checked) and its scale as they are on device ``dev``, else None."""
    if type(b_scale) is not torch.Tensor or b_scale.dtype is not torch.float32:
        return None
    n, b_k = b.shape
    kb, nb = k >> 7, (n + 127) >> 7
    if b_k != k or not n or n & 15 or b_scale.shape != (nb, kb):
        return None
    ldb, b1 = b.stride()
    if b1 != 1 or ldb < k or ldb & 15:
        return None
    b_scale_ld = read_b_scale_ld(b_scale.stride(), nb, kb)
    if b_scale_ld is None or _device_index(b) != dev or _device_index(b_scale) != dev:
        return None
    if (b.data_ptr() | b_scale.data_ptr()) & 15:
        return None
    return ldb, b_scale_ld


# Scratch up to this size (split-K partial sums, the FP8 copy of a decode step's activations) is kept per
# stream: one allocation less per call, ~2 us of host time. Kernels on one stream run in order, so a kept
# buffer is never written while an earlier kernel reads it; under graph capture every call allocates, as
# a graph must own its memory.
SCRATCH_KEPT_BYTES = 1 << 20
_kept_scratch: dict[int, tuple[torch.Tensor, int]] = {}
_capturing = torch.cuda.is_current_stream_capturing
registry.on_refresh(_kept_scratch.clear)


def _scratch(nbytes: int, stream: int, device: torch.device) -> int:
    """The device address of ``nbytes`` of scratch for kernels launched next on ``stream`` (the current one)."""
    if not nbytes:
        return 0
    if nbytes <= SCRATCH_KEPT_BYTES and not _capturing():
        kept = _kept_scratch.get(stream)
        if kept is None:
            buffer = torch.empty(SCRATCH_KEPT_BYTES, dtype=torch.uint8, device=device)
            kept = _kept_scratch[stream] = (buffer, buffer.data_ptr())
        return kept[1]
    return torch.empty(nbytes, dtype=torch.uint8, device=device).data_ptr()  # freed to this stream, in order


def _try_fast(backend_name, a, b, a_scale, b_scale, out, out_dtype):  # noqa: C901 - one flat check list
    tensor = torch.Tensor
    if type(a) is not tensor or type(b) is not tensor or type(a_scale) is not tensor:
        return None
    dev = _device_index(a)
    if dev < 0:
        return None
    found = _fast_backend(dev, backend_name or os.environ.get(registry.ENV_VAR) or None)
    if found is None:
        return None
    backend, fp8, read_a_scale_ld, read_b_scale_ld = found
    f32 = torch.float32
    if a.dtype is not fp8 or b.dtype is not fp8 or a_scale.dtype is not f32 or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    m, k = a.shape
    if not m or not k or k & 127 or a_scale.shape != (m, k >> 7):
        return None
    weight = _fast_weight(read_b_scale_ld, b, b_scale, k, dev)
    if weight is None:
        return None
    ldb, b_scale_ld = weight
    n = b.shape[0]
    lda, a1 = a.stride()
    if a1 != 1 or lda < k or lda & 15:
        return None
    a_scale_ld = read_a_scale_ld(a_scale.stride(), m, k >> 7)
    if a_scale_ld is None:
        return None
    if out is None:
        if out_dtype is not None and out_dtype is not torch.bfloat16 and out_dtype is not f32:
            return None
    else:
        if type(out) is not tensor:
            return None
        o_dtype = out.dtype
        if (o_dtype is not torch.bfloat16 and o_dtype is not f32) or out.shape != (m, n):
            return None
        if (out_dtype is not None and out_dtype is not o_dtype) or _device_index(out) != dev:
            return None
        ldo, o1 = out.stride()
        if o1 != 1 or ldo < n or (ldo << (2 if o_dtype is f32 else 1)) & 15 or out.data_ptr() & 15:
            return None
    if _device_index(a_scale) != dev:
        return None
    ptrs = (a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr())
    if (ptrs[0] | ptrs[2]) & 15 or _current_device() != dev:
        return None
    if out is None:  # only now: a call that falls back must not allocate twice
        out = torch.empty((m, n), dtype=out_dtype or torch.bfloat16, device=a.device)
        ldo = n
    stream = _raw_stream(dev)
    workspace = _scratch(backend.workspace_bytes(m, n, k), stream, a.device)
    backend.launch(*ptrs, out.data_ptr(), workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld,
                   OUT_FP32 if out.dtype is f32 else OUT_BF16, stream)  # fmt: skip
    return out


def _launch(backend: Backend, a, b, a_scale, b_scale, out: torch.Tensor) -> None:
    m, k = a.shape
    n = b.shape[0]
    a_scale, a_scale_ld = conform_scale(a_scale, backend.a_scale_layout)
    b_scale, b_scale_ld = conform_scale(b_scale, backend.b_scale_layout)
    ws_bytes = backend.workspace_bytes(m, n, k)
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
    stream = _raw_stream(a.device.index)
    backend.launch(
        a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(),
        workspace.data_ptr() if workspace is not None else 0,
        m, n, k, a.stride(0), b.stride(0), out.stride(0), a_scale_ld, b_scale_ld,
        OUT_FP32 if out.dtype == torch.float32 else OUT_BF16, stream,
    )  # fmt: skip


def _run(backend_name: str, a, b, a_scale, b_scale, out, out_dtype) -> torch.Tensor:
    """Validate, pick the backend, allocate ``out`` if needed, and run."""
    check_tensor("a", a)  # the device of a picks the backend
    backend = registry.select(a.device, backend_name or None).backend
    dtype = check_inputs(a, b, a_scale, b_scale, out, out_dtype, backend.fp8_dtype)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[0]), dtype=dtype, device=a.device)
    if a.shape[0] == 0:
        return out
    if backend is REFERENCE:
        return reference_gemm(a, b, a_scale, b_scale, out)
    with _device_guard(a.device):
        _launch(backend, a, b, a_scale, b_scale, out)
    return out


# --- torch.library ops: what torch.compile and graph capture see -----------------------------------


@torch.library.custom_op("fp8gemm::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
             out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    return _run(backend, a, b, a_scale, b_scale, None, out_dtype)


@_gemm_op.register_fake
def _(a, b, a_scale, b_scale, out_dtype, backend):
    dtype = check_inputs(a, b, a_scale, b_scale, None, out_dtype, None)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=dtype)


@torch.library.custom_op("fp8gemm::gemm_out", mutates_args=("out",))
def _gemm_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                 out: torch.Tensor, backend: str) -> None:  # fmt: skip
    _run(backend, a, b, a_scale, b_scale, out, None)


@_gemm_out_op.register_fake
def _(a, b, a_scale, b_scale, out, backend):
    check_inputs(a, b, a_scale, b_scale, out, None, None)


def gemm(a, b, a_scale, b_scale, *, out=None, out_dtype=None, backend: str | None = None) -> torch.Tensor:
    """``out[m, n] = sum_k a[m, k] * b[n, k] * a_scale[m, k // 128] * b_scale[n // 128, k // 128]``.

    a: FP8 [M, K] (activations), b: FP8 [N, K] (the nn.Linear weight), both K-contiguous.
    a_scale: fp32 [M, K/128]; b_scale: fp32 [ceil(N/128), K/128]; either row- or column-major.
    out_dtype: torch.bfloat16 (default) or torch.float32; ``out=`` is written in place.
    backend: a backend name or "reference"; default ``$FP8GEMM_BACKEND``, else the best fit for the
    device. See docs/architecture.md for the full contract.
    """
    if torch.compiler.is_compiling():
        if out is not None:
            torch.ops.fp8gemm.gemm_out(a, b, a_scale, b_scale, out, backend or "")
            return out
        return torch.ops.fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype or torch.bfloat16, backend or "")
    # Eager calls skip the op dispatcher: same code, a few microseconds less per call.
    fast = _try_fast(backend, a, b, a_scale, b_scale, out, out_dtype)
    return fast if fast is not None else _run(backend or "", a, b, a_scale, b_scale, out, out_dtype)


def prepare_weight_scale(b_scale: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``b_scale`` converted once into the layout the backend for its device reads.

    Weights are static: pass the result to every ``gemm`` call and no per-call conversion happens.
    """
    if not isinstance(b_scale, torch.Tensor) or b_scale.dim() != 2 or b_scale.dtype != torch.float32:
        raise TypeError("b_scale must be a 2-D torch.float32 tensor [ceil(N/128), K/128]")
    chosen = registry.select(b_scale.device, backend).backend
    if chosen is REFERENCE:
        return b_scale
    return conform_scale(b_scale, chosen.b_scale_layout)[0]


def preferred_fp8_dtype(device: torch.device | str, backend: str | None = None) -> torch.dtype:
    """The FP8 dtype the backend for ``device`` takes (e4m3fn on CPU/reference)."""
    chosen = registry.select(device, backend).backend
    return getattr(torch, chosen.fp8_dtype) if chosen.fp8_dtype else torch.float8_e4m3fn
