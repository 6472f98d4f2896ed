"""``fp8gemm.gemm``: one planned call (``plans``) run by ``launch``; the torch.library ops for torch.compile; and
``prepare_weight_scale`` and ``preferred_fp8_dtype``, which name what the backend for a device reads."""

from __future__ import annotations

import torch

from . import registry, runtime
from .autograd import refuse_grad
from .grouped_checks import conform_group_scale
from .launch import run_gemm, run_wgrad
from .native import reraise_unless_miss
from .plans import WgradPlan, checked_gemm_plan, fast_gemm_plan
from .reference import REFERENCE
from .runtime import LIBRARY
from .validation import GEMM_NAMES, check_accumulate, check_inputs, conform_scale

# --- torch.library ops: what torch.compile and graph capture see -----------------------------------


@runtime.op("gemm", "gemm", GEMM_NAMES)
def _gemm_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
             out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    return eager_gemm(a, b, a_scale, b_scale, None, out_dtype, backend or None)


@_gemm_op.register_fake
def _(a, b, a_scale, b_scale, out_dtype, backend):
    dtype = check_inputs(a, b, a_scale, b_scale, None, out_dtype, None)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=dtype)


@runtime.op("gemm_out", "gemm", (*GEMM_NAMES, "out"), mutates_args=("out",))
def _gemm_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                 out: torch.Tensor, backend: str) -> None:  # fmt: skip
    eager_gemm(a, b, a_scale, b_scale, out, None, backend or None)


@_gemm_out_op.register_fake
def _(a, b, a_scale, b_scale, out, backend):
    check_inputs(a, b, a_scale, b_scale, out, None, None)


_ops = getattr(torch.ops, LIBRARY)


def gemm(
    a, b, a_scale, b_scale, *, out=None, out_dtype=None, accumulate: bool = False, backend: str | None = None
) -> torch.Tensor:
    """``out[m, n] = sum_k a[m, k] * b[n, k] * a_scale[m, k // 128] * b_scale[n // 128, k // 128]``.

    a: FP8 [M, K] (activations), b: FP8 [N, K] (the nn.Linear weight), both K-contiguous.
    a_scale: fp32 [M, K/128]; b_scale: fp32 [ceil(N/128), K/128]; either row- or column-major.
    b_scale may instead be per row, fp32 [N, K/128] (``b_scale[n, k // 128]``: the weight-gradient, "1D1D" form);
    it runs the backend's weight-gradient entry where it has one, else the reference.
    out_dtype: torch.bfloat16 (default) or torch.float32; ``out=`` is written in place, or with
    ``accumulate=True`` (a float32 ``out`` only) the product is added to it.
    backend: a backend name or "reference"; default ``$FP8GEMM_BACKEND``, else the best fit for the
    device. See docs/architecture.md for the full contract.
    """
    if torch.is_grad_enabled():  # refuse_grad's first test, sparing inference a call; a guard when compiling
        refuse_grad("gemm", GEMM_NAMES, (a, b, a_scale, b_scale))
    if accumulate:
        return _gemm_accumulate(a, b, a_scale, b_scale, out, out_dtype, backend)
    if torch.compiler.is_compiling():
        if out is not None:
            _ops.gemm_out(a, b, a_scale, b_scale, out, backend or "")
            return out
        return _ops.gemm(a, b, a_scale, b_scale, out_dtype or torch.bfloat16, backend or "")
    return eager_gemm(a, b, a_scale, b_scale, out, out_dtype, backend)


def eager_gemm(a, b, a_scale, b_scale, out, out_dtype, backend: str | None) -> torch.Tensor:
    """One call (eager calls skip the Python op; also the compiled ops' body): the backend's native op where it takes
    the call, else the planned call."""
    # MN-major a_scale (quantize_activation's), a valid out_dtype: what the native op takes (a declined call costs an
    # exception before the planner, and caller scales in row-major are common)
    native = _native_for(a, b, a_scale, b_scale, backend)
    if native is not None and (out_dtype is None or out_dtype is torch.bfloat16 or out_dtype is torch.float32):
        try:
            per_row = _per_row(b, b_scale)
            if out is None:
                return (native.wgrad if per_row else native.gemm)(a, b, a_scale, b_scale, out_dtype is torch.float32)
            if out_dtype is None or out_dtype is out.dtype:
                if per_row:
                    native.wgrad_out(a, b, a_scale, b_scale, out, False)
                else:
                    native.gemm_out(a, b, a_scale, b_scale, out)
                return out
        except RuntimeError as error:
            reraise_unless_miss(error)
    plan = fast_gemm_plan(a, b, a_scale, b_scale, out, out_dtype, backend)
    if plan is None:
        return _run(checked_gemm_plan(a, b, a_scale, b_scale, out, out_dtype, backend), a, b, out)
    return run_gemm(plan, a, b, out)


def _native_for(a, b, a_scale, b_scale, backend: str | None):
    """The native ops that may take this call (MN-major 2-D ``a_scale``, as ``quantize_activation`` returns it, plain
    scale tensors), else None; they still decline (a miss) what they do not read in place."""
    native = runtime.native_ops(a, b, backend)
    if (
        native is not None
        and type(a_scale) is torch.Tensor
        and len(a_scale.shape) == 2
        and (a_scale.stride(0) == 1 or a_scale.shape[0] == 1)
        and type(b_scale) is torch.Tensor
    ):
        return native
    return None


def _per_row(b, b_scale) -> bool:
    """A per-row ``b_scale`` [N, K/128] (N > 1: with one row the two forms coincide): the weight-gradient form."""
    return b_scale.shape[:1] == b.shape[:1] and b.shape[0] > 1


def _run(plan, a, b, out) -> torch.Tensor:
    """A checked plan's run: the weight-gradient entry's (:class:`WgradPlan`) or the GEMM's."""
    if type(plan) is WgradPlan:
        return run_wgrad(plan, a, b, out)
    return run_gemm(plan, a, b, out)


def _gemm_accumulate(a, b, a_scale, b_scale, out, out_dtype, backend) -> torch.Tensor:
    """``out += a @ b.T`` (block-scaled), float32 ``out``: one launch of the backend's weight-gradient entry, which adds
    into its output, where it has one (eager per-row scales through its native op after the checks; a per-block
    ``b_scale`` repeated onto its rows by the planner); else the product in float32 as for ``out=None``, then one add.
    Compiled: the product, then the add (the ops have no accumulating form)."""
    check_accumulate(out, accumulate=True)
    if not torch.compiler.is_compiling():  # out's shape, device and dtype before any work; compiled: the fake's checks
        check_inputs(a, b, a_scale, b_scale, out, out_dtype, None)
        if torch.is_grad_enabled():
            refuse_grad("gemm", (*GEMM_NAMES, "out"), (a, b, a_scale, b_scale, out))
        native = _native_for(a, b, a_scale, b_scale, backend) if _per_row(b, b_scale) else None
        if native is not None:  # checked inputs: the native op adds into out, or declines (a miss) to the planner
            try:
                native.wgrad_out(a, b, a_scale, b_scale, out, True)
                return out
            except RuntimeError as error:
                reraise_unless_miss(error)
        plan = checked_gemm_plan(a, b, a_scale, b_scale, out, out_dtype, backend, accumulate=True)
        if type(plan) is WgradPlan:
            return run_wgrad(plan, a, b, out, accumulate=True)
    elif out_dtype not in (None, torch.float32) or tuple(out.shape) != (a.shape[0], b.shape[0]):
        raise ValueError(f"out must be [M, N] = [{a.shape[0]}, {b.shape[0]}] float32, got {tuple(out.shape)}")
    return out.add_(gemm(a, b, a_scale, b_scale, out_dtype=torch.float32, backend=backend))


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
