"""One plan per call of ``gemm``, ``linear`` and ``quantize_activation``: the backend resolved once, each input
checked once, and what the launch reads (shapes, leading dimensions, the scales in the backend's layout).

``gemm`` and ``linear`` have two planners: a call's plan is ``fast_*_plan(...) or checked_*_plan(...)``. The fast
one plans the steady-state eager call (tensors on the current GPU, scales already in the backend's layout) with the
fewest tensor-attribute reads: a serving engine calls them thousands of times per second with the same metadata. It
gives up (None) on anything unusual, and the checked planner then checks in full and raises the precise error under
the caller's argument names. The fast planner never accepts what the checked one refuses (tests/test_registry.py
and the GPU suite check both paths). Neither allocates, so a call that falls back allocates once. A fast plan is a
plain tuple of its NamedTuple's fields, in their order (the runs unpack either): a NamedTuple costs the steady-state
call a Python call to build and a slower unpacking, some 0.5 us in all on a CPU host.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import registry, runtime
from .reference import REFERENCE, b_scale_rows
from .runtime import IN_KINDS
from .validation import (
    GEMM_NAMES,
    check_fp8_dtype,
    check_inputs,
    check_linear,
    check_source,
    conform_scale,
    per_row_scale,
)


class GemmPlan(NamedTuple):
    """One checked GEMM: ``out[m, n] = a[m, k] @ b[n, k].T``, block-scaled."""

    backend: object  # the Backend that runs it, or REFERENCE
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    a_scale: torch.Tensor  # in the backend's layout (as passed, for the reference)
    a_scale_ld: int
    b_scale: torch.Tensor
    b_scale_ld: int
    out_dtype: torch.dtype
    device: int  # the tensors' device index (runtime.device_index)
    elsewhere: bool  # it is not the current device: the launch makes it current (runtime.switch_needed)


class WgradPlan(NamedTuple):
    """One checked weight-gradient GEMM for the backend's ``wgrad_launch``: ``out[m, n] (+)= a[m, k] @ b[n, k].T`` with
    1x128 scales along K on both operands, float32 or bf16 out (the per-row ``b_scale`` form, or a per-block one
    repeated onto its rows for ``accumulate=True``, float32 then)."""

    backend: object  # a Backend with wgrad_launch
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    a_scale: torch.Tensor  # in the backend's a_scale_layout
    a_scale_ld: int
    b_scale: torch.Tensor  # [N, K/128], in the backend's wgrad_b_scale_layout
    b_scale_ld: int
    out_dtype: torch.dtype  # float32, or bfloat16 (not with accumulate)
    device: int
    elsewhere: bool


class LinearPlan(NamedTuple):
    """One checked ``linear``: x [M, K] (leading dims flattened) quantized per token, then the GEMM with the weight."""

    backend: object  # the Backend that runs it, or REFERENCE
    in_kind: int  # x's dtype, as the kernels name it (protocol.IN_*)
    m: int
    n: int
    k: int
    ldb: int
    weight_scale: torch.Tensor  # in the backend's layout (as passed, for the reference)
    b_scale_ld: int
    out_dtype: torch.dtype  # the GEMM's: bf16 for bf16 x, else fp32 (converted to x's dtype after)
    device: int
    elsewhere: bool


class QuantizePlan(NamedTuple):
    """One checked ``quantize_activation`` of x [M, K] (leading dims flattened)."""

    kernel: object  # the Backend whose quantization kernel runs, or None: the reference
    fp8_dtype: torch.dtype
    layout: object  # the ScaleLayout the scales are returned in (the backend's), or None: row-major
    m: int
    k: int
    device: int
    elsewhere: bool


def gemm_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The GEMM output ``linear`` asks for: bf16 for bf16 x, else fp32 (fp16 goes through fp32)."""
    return torch.bfloat16 if x_dtype is torch.bfloat16 else torch.float32


# --- gemm -------------------------------------------------------------------------------------------------------


def fast_gemm_plan(a, b, a_scale, b_scale, out, out_dtype, backend_name):  # noqa: C901 - one flat check list
    """The steady-state call's plan with the fewest checks, or None: then :func:`checked_gemm_plan` checks in full."""
    tensor = torch.Tensor
    if type(a) is not tensor or type(b) is not tensor or type(a_scale) is not tensor:
        return None
    dev = runtime.device_index(a)
    if dev < 0:
        return None
    found = runtime.fast_backend(dev, runtime.requested_backend(backend_name))
    if found is None:
        return None
    backend, fp8, read_a_scale_ld = found[:3]
    f32 = torch.float32
    if a.dtype is not fp8 or b.dtype is not fp8 or a_scale.dtype is not f32 or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    m, k = a.shape
    if not m or not k or k & 127 or a_scale.shape != (m, k >> 7):
        return None
    lds = weight_lds(found, b, b_scale, k, dev)
    if lds is None:
        return None
    n = b.shape[0]
    lda, a1 = a.stride()
    if a1 != 1 or lda < k or lda & 15:
        return None
    a_scale_ld = read_a_scale_ld(a_scale.stride(), m, k >> 7)
    if a_scale_ld is None:
        return None
    if out is None:
        if out_dtype is None:
            out_dtype = torch.bfloat16
        elif out_dtype is not torch.bfloat16 and out_dtype is not f32:
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
        out_dtype = o_dtype
    if runtime.device_index(a_scale) != dev or (a.data_ptr() | a_scale.data_ptr()) & 15:
        return None
    if runtime.current_device() != dev:
        return None
    ldb, b_scale_ld = lds
    return backend, m, n, k, lda, ldb, a_scale, a_scale_ld, b_scale, b_scale_ld, out_dtype, dev, False  # a GemmPlan


def checked_gemm_plan(
    a, b, a_scale, b_scale, out, out_dtype, backend_name, names=GEMM_NAMES, accumulate: bool = False
) -> GemmPlan | WgradPlan:
    """Every check of one ``gemm`` call with its error under the caller's ``names``, and the scales conformed to the
    backend's layout. A per-row ``b_scale`` (the weight-gradient form), and with ``accumulate`` any ``b_scale``, is
    planned on the backend's ``wgrad_launch`` (a :class:`WgradPlan`) where it has one; else a per-row ``b_scale`` runs
    the reference and ``accumulate`` the product (``launch``, then one add)."""
    if not isinstance(a, torch.Tensor):  # its device picks the backend
        raise TypeError(f"{names[0]} must be a torch.Tensor, got {type(a).__name__}")
    backend = registry.select(a.device, backend_name or None).backend
    dtype = check_inputs(a, b, a_scale, b_scale, out, out_dtype, backend.fp8_dtype, names)
    (m, k), n = a.shape, b.shape[0]
    per_row = per_row_scale(b, b_scale)
    if (per_row or accumulate) and m and getattr(backend, "wgrad_launch", None) is not None:
        return _wgrad_plan(backend, a, b, a_scale, b_scale if per_row else b_scale_rows(b_scale, n), dtype)
    if per_row:  # the backend has no weight-gradient entry (LaunchArgs has no per-row B scale)
        backend = REFERENCE
    if backend is REFERENCE or not m:
        return GemmPlan(backend, m, n, k, 0, 0, a_scale, 0, b_scale, 0, dtype, -1, False)
    a_scale, a_scale_ld = conform_scale(a_scale, backend.a_scale_layout)
    b_scale, b_scale_ld = conform_scale(b_scale, backend.b_scale_layout)
    lds, dev = (runtime.row_stride(a), b.stride(0)), runtime.device_index(a)
    switch = runtime.switch_needed(dev)
    return GemmPlan(backend, m, n, k, *lds, a_scale, a_scale_ld, b_scale, b_scale_ld, dtype, dev, switch)


def _wgrad_plan(backend, a, b, a_scale, b_scale, out_dtype) -> WgradPlan:
    """The checked operands (M > 0) planned on ``backend.wgrad_launch``: the scales conformed to its layouts (a copy
    where they differ, as for the forward's activation scales)."""
    (m, k), n = a.shape, b.shape[0]
    a_scale, a_scale_ld = conform_scale(a_scale, backend.a_scale_layout)
    b_scale, b_scale_ld = conform_scale(b_scale, backend.wgrad_b_scale_layout)
    dev = runtime.device_index(a)
    switch = runtime.switch_needed(dev)
    lds = (runtime.row_stride(a), runtime.row_stride(b))
    return WgradPlan(backend, m, n, k, *lds, a_scale, a_scale_ld, b_scale, b_scale_ld, out_dtype, dev, switch)


def weight_lds(found: runtime.FastBackend, b, b_scale, k: int, dev: int):
    """``(ldb, b_scale_ld)`` where the kernel can read the weight ``b`` [N, K] (2-D, the backend's FP8 dtype: the
    caller checked) and its scale in place on device ``dev``; None sends the call to the checked planner."""
    if type(b_scale) is not torch.Tensor or b_scale.dtype is not torch.float32:
        return None
    n, b_k = b.shape
    kb, nb = k >> 7, (n + 127) >> 7
    if b_k != k or not n or n & 15 or b_scale.shape != (nb, kb):
        return None
    ldb, b1 = b.stride()
    if b1 != 1 or ldb < k or ldb & 15:
        return None
    b_scale_ld = found.read_b_scale_ld(b_scale.stride(), nb, kb)
    if b_scale_ld is None or runtime.device_index(b) != dev or runtime.device_index(b_scale) != dev:
        return None
    if (b.data_ptr() | b_scale.data_ptr()) & 15:
        return None
    return ldb, b_scale_ld


# --- linear -----------------------------------------------------------------------------------------------------


def fast_linear_plan(x, weight, weight_scale, bias, backend_name):
    """The steady-state call's plan (a backend with a quantization kernel, plain tensors) with the fewest checks, or
    None: then :func:`checked_linear_plan` checks in full."""
    tensor = torch.Tensor
    if type(x) is not tensor or type(weight) is not tensor or len(weight.shape) != 2:
        return None
    in_kind, dev = IN_KINDS.get(x.dtype), runtime.device_index(x)
    if in_kind is None or dev < 0 or dev != runtime.current_device():
        return None
    found = runtime.fast_backend(dev, runtime.requested_backend(backend_name))
    if found is None or weight.dtype is not found.fp8_dtype or found.backend.quantize is None:
        return None
    shape, (n, k) = x.shape, weight.shape
    if not shape or shape[-1] != k or not k or k & 127:
        return None
    if bias is not None and (
        type(bias) is not tensor or bias.dtype is not x.dtype or bias.shape != (n,) or runtime.device_index(bias) != dev
    ):
        return None
    lds = weight_lds(found, weight, weight_scale, k, dev)
    if lds is None:
        return None
    m = shape[0] if len(shape) == 2 else x.numel() // k
    if not m:
        return None
    ldb, b_scale_ld = lds
    out_dtype = torch.bfloat16 if x.dtype is torch.bfloat16 else torch.float32  # gemm_dtype, inline
    return found.backend, in_kind, m, n, k, ldb, weight_scale, b_scale_ld, out_dtype, dev, False  # a LinearPlan


def checked_linear_plan(x, weight, weight_scale, bias, backend_name) -> LinearPlan:
    """Every check of one ``linear`` call with its error, and the weight's scales conformed to the backend's layout."""
    check_linear(x, weight, weight_scale, bias)
    backend = registry.select(x.device, backend_name or None).backend
    if backend.fp8_dtype and weight.dtype != getattr(torch, backend.fp8_dtype):
        raise TypeError(
            f"weight is {weight.dtype}, but the backend for {x.device} ({backend.name}) takes torch.{backend.fp8_dtype}; "
            f"convert it with fp8gemm.nn.to_fp8_dtype(weight, weight_scale, torch.{backend.fp8_dtype}), or load the "
            f"layer through fp8gemm.nn.Fp8Linear, which converts on load"
        )
    n, k = weight.shape
    m = x.numel() // k
    out_dtype, in_kind = gemm_dtype(x.dtype), IN_KINDS[x.dtype]
    if backend is REFERENCE or not m:
        return LinearPlan(backend, in_kind, m, n, k, 0, weight_scale, 0, out_dtype, -1, False)
    weight_scale, b_scale_ld = conform_scale(weight_scale, backend.b_scale_layout)
    ldb, dev = weight.stride(0), runtime.device_index(x)
    switch = runtime.switch_needed(dev)
    return LinearPlan(backend, in_kind, m, n, k, ldb, weight_scale, b_scale_ld, out_dtype, dev, switch)


# --- quantize_activation ----------------------------------------------------------------------------------------


def plan_quantize(x, fp8_dtype, backend_name, name: str = "x") -> QuantizePlan:
    """The plan of one ``quantize_activation`` call: the backend's kernel where it takes ``fp8_dtype``, else the
    reference, with the scales in the backend's layout either way."""
    check_source(name, x)
    if fp8_dtype is not None:
        check_fp8_dtype(fp8_dtype)
    chosen, default_dtype, layout = registry.backend_defaults(x.device, backend_name or None)
    fp8_dtype = fp8_dtype or default_dtype
    k = x.shape[-1]
    m = x.numel() // k
    if not m or chosen is None or chosen.quantize is None or getattr(torch, chosen.fp8_dtype) is not fp8_dtype:
        return QuantizePlan(None, fp8_dtype, layout, m, k, -1, False)
    dev = runtime.device_index(x)
    return QuantizePlan(chosen, fp8_dtype, layout, m, k, dev, runtime.switch_needed(dev))
