"""``fp8gemm.gemm``: validation, backend dispatch, and the torch.library ops for torch.compile."""

from __future__ import annotations

import torch

from . import registry, runtime
from .grouped_checks import conform_group_scale
from .protocol import LAUNCH_ARGS, Backend
from .reference import REFERENCE, reference_gemm
from .runtime import LIBRARY
from .validation import GEMM_NAMES, check_inputs, check_tensor, conform_scale

_pack_launch = LAUNCH_ARGS.pack

# --- fast path: the steady-state call (valid inputs, scales already in the backend's layout) ---------
# A serving engine calls gemm thousands of times per second with the same metadata, and the general
# path below spends ~20 Python-level checks on it. The fast path tests the same conditions with the
# fewest tensor-attribute reads and gives up (returns None) on anything unusual; the general path
# then validates in full and produces the error message. It never accepts what the general path
# rejects (tests/test_registry.py and the GPU suite check both paths).


def try_fast_gemm(backend_name, a, b, a_scale, b_scale, out, out_dtype):  # noqa: C901 - one flat check list
    """The steady-state eager call with the fewest checks, or None: then :func:`run_gemm` checks in full."""
    tensor = torch.Tensor
    if type(a) is not tensor or type(b) is not tensor or type(a_scale) is not tensor:
        return None
    if (a.requires_grad or a_scale.requires_grad) and runtime.grad_enabled():  # the checked path refuses them
        return None
    dev = runtime.device_index(a)
    if dev < 0:
        return None
    found = runtime.fast_backend(dev, runtime.requested_backend(backend_name))
    if found is None:
        return None
    backend, fp8, read_a_scale_ld, _ = found
    f32 = torch.float32
    if a.dtype is not fp8 or b.dtype is not fp8 or a_scale.dtype is not f32 or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    m, k = a.shape
    if not m or not k or k & 127 or a_scale.shape != (m, k >> 7):
        return None
    weight = runtime.weight_lds(found, b, b_scale, k, dev)
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
        if (out_dtype is not None and out_dtype is not o_dtype) or runtime.device_index(out) != dev:
            return None
        ldo, o1 = out.stride()
        if o1 != 1 or ldo < n or (ldo << (2 if o_dtype is f32 else 1)) & 15 or out.data_ptr() & 15:
            return None
    if runtime.device_index(a_scale) != dev:
        return None
    ptrs = (a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr())
    if (ptrs[0] | ptrs[2]) & 15 or runtime.current_device() != dev:
        return None
    if out is None:  # only now: a call that falls back must not allocate twice
        out = torch.empty((m, n), dtype=out_dtype or torch.bfloat16, device=a.device)
        ldo = n
    stream = runtime.raw_stream(dev)
    workspace = runtime.scratch(backend.workspace_bytes(m, n, k), a.device, stream)
    backend.launch(_pack_launch(*ptrs, out.data_ptr(), workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld,
                                runtime.out_kind(out.dtype), stream))  # fmt: skip
    return out


def launch_gemm(backend: Backend, a, b, a_scale, b_scale, out: torch.Tensor) -> None:
    """One launch on checked operands (scales conformed here), on the current device and stream."""
    m, k = a.shape
    n = b.shape[0]
    a_scale, a_scale_ld = conform_scale(a_scale, backend.a_scale_layout)
    b_scale, b_scale_ld = conform_scale(b_scale, backend.b_scale_layout)
    stream = runtime.raw_stream(a.device.index)
    workspace = runtime.scratch(backend.workspace_bytes(m, n, k), a.device, stream)
    backend.launch(_pack_launch(
        a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(), workspace,
        m, n, k, a.stride(0), b.stride(0), out.stride(0), a_scale_ld, b_scale_ld, runtime.out_kind(out.dtype), stream,
    ))  # fmt: skip


def run_gemm(backend_name: str | None, a, b, a_scale, b_scale, out, out_dtype, names=GEMM_NAMES) -> torch.Tensor:
    """Validate (errors under the caller's ``names``), pick the backend, allocate ``out`` if needed, and run on the
    tensors' device."""
    check_tensor(names[0], a)  # the device of a picks the backend
    backend = registry.select(a.device, backend_name or None).backend
    dtype = check_inputs(a, b, a_scale, b_scale, out, out_dtype, backend.fp8_dtype, names)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[0]), dtype=dtype, device=a.device)
    if a.shape[0] == 0:
        return out
    if backend is REFERENCE:
        return reference_gemm(a, b, a_scale, b_scale, out)
    with runtime.on_device(a.device):
        launch_gemm(backend, a, b, a_scale, b_scale, out)
    return out


# --- torch.library ops: what torch.compile and graph capture see -----------------------------------


@runtime.op("gemm", "gemm", GEMM_NAMES)
def _gemm_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
             out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    return run_gemm(backend, a, b, a_scale, b_scale, None, out_dtype)


@_gemm_op.register_fake
def _(a, b, a_scale, b_scale, out_dtype, backend):
    dtype = check_inputs(a, b, a_scale, b_scale, None, out_dtype, None)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=dtype)


@runtime.op("gemm_out", "gemm", (*GEMM_NAMES, "out"), mutates_args=("out",))
def _gemm_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                 out: torch.Tensor, backend: str) -> None:  # fmt: skip
    run_gemm(backend, a, b, a_scale, b_scale, out, None)


@_gemm_out_op.register_fake
def _(a, b, a_scale, b_scale, out, backend):
    check_inputs(a, b, a_scale, b_scale, out, None, None)


_ops = getattr(torch.ops, LIBRARY)


def gemm(a, b, a_scale, b_scale, *, out=None, out_dtype=None, backend: str | None = None) -> torch.Tensor:
    """``out[m, n] = sum_k a[m, k] * b[n, k] * a_scale[m, k // 128] * b_scale[n // 128, k // 128]``.

    a: FP8 [M, K] (activations), b: FP8 [N, K] (the nn.Linear weight), both K-contiguous.
    a_scale: fp32 [M, K/128]; b_scale: fp32 [ceil(N/128), K/128]; either row- or column-major.
    out_dtype: torch.bfloat16 (default) or torch.float32; ``out=`` is written in place.
    backend: a backend name or "reference"; default ``$FP8GEMM_BACKEND``, else the best fit for the
    device. See docs/architecture.md for the full contract.
    """
    if torch.compiler.is_compiling():
        runtime.refuse_grad("gemm", GEMM_NAMES, (a, b, a_scale, b_scale))  # traced as a guard
        if out is not None:
            _ops.gemm_out(a, b, a_scale, b_scale, out, backend or "")
            return out
        return _ops.gemm(a, b, a_scale, b_scale, out_dtype or torch.bfloat16, backend or "")
    # Eager calls skip the op dispatcher: same code, a few microseconds less per call.
    fast = try_fast_gemm(backend, a, b, a_scale, b_scale, out, out_dtype)
    if fast is not None:
        return fast
    runtime.refuse_grad("gemm", GEMM_NAMES, (a, b, a_scale, b_scale))
    return run_gemm(backend, a, b, a_scale, b_scale, out, out_dtype)


def prepare_weight_scale(b_scale: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``b_scale`` converted once into the layout the backend for its device reads.

    Weights are static: pass the result to every ``gemm`` call and no per-call conversion happens. A 3-D
    [G, ceil(N/128), K/128] scale (one per expert, for ``grouped_gemm``) is converted group by group, each group
    starting 16-byte aligned; the group stride is kept in the result's strides.
    """
    if not isinstance(b_scale, torch.Tensor) or b_scale.dtype != torch.float32:
        got = b_scale.dtype if isinstance(b_scale, torch.Tensor) else type(b_scale).__name__
        raise TypeError(f"b_scale must be a torch.float32 tensor [ceil(N/128), K/128] (or [G, ...]), got {got}")
    if b_scale.dim() not in (2, 3):
        raise ValueError(
            f"b_scale must be 2-D [ceil(N/128), K/128] or 3-D [G, ceil(N/128), K/128] (one per expert), got shape "
            f"{tuple(b_scale.shape)}"
        )
    chosen = registry.select(b_scale.device, backend).backend
    if chosen is REFERENCE:
        return b_scale
    if b_scale.dim() == 3:
        return conform_group_scale(b_scale, chosen.b_scale_layout)[0]
    return conform_scale(b_scale, chosen.b_scale_layout)[0]


def preferred_fp8_dtype(device: torch.device | str, backend: str | None = None) -> torch.dtype:
    """The FP8 dtype the backend for ``device`` takes (e4m3fn on CPU/reference)."""
    chosen = registry.select(device, backend).backend
    return getattr(torch, chosen.fp8_dtype) if chosen.fp8_dtype else torch.float8_e4m3fn
