"""The runs of planned calls: each ``run_*`` takes the plan of one call (``plans``, ``grouped_checks``) and the
tensors it was made for, and runs it on their device's current stream: the backend's kernels, or the pure-torch
reference. Nothing here checks an input or looks a backend up: the plan did, once.

Scratch is taken last in each run, after every allocation of the call: an unkept buffer is freed to the stream at
once, and the launch that reads it is the next work queued there.
"""

from __future__ import annotations

import torch

from . import runtime
from .grouped_checks import GroupedPlan
from .grouped_reference import reference_grouped
from .plans import GemmPlan, LinearPlan, QuantizePlan, WgradPlan
from .protocol import GROUPED_ARGS, GROUPED_MASKED, LAUNCH_ARGS, LINEAR_ARGS, WGRAD_ARGS
from .reference import REFERENCE, reference_gemm, reference_quantize
from .validation import layout_ld

_pack_gemm = LAUNCH_ARGS.pack
_pack_linear = LINEAR_ARGS.pack
_pack_grouped = GROUPED_ARGS.pack
_pack_wgrad = WGRAD_ARGS.pack


def run_gemm(plan: GemmPlan, a, b, out) -> torch.Tensor:
    """``out`` (allocated when None) <- the planned GEMM of ``a`` [M, K] and ``b`` [N, K]. The launch is
    ``runtime.call_gemm``'s, written out here: the steady-state call's host time is a Python call less."""
    backend, m, n, k, lda, ldb, a_scale, a_scale_ld, b_scale, b_scale_ld, out_dtype, dev, elsewhere = plan
    if out is None:
        out, ldo = torch.empty((m, n), dtype=out_dtype, device=a.device), n
    else:
        ldo = runtime.row_stride(out)
    if not m:
        return out
    if backend is REFERENCE:
        return reference_gemm(a, b, a_scale, b_scale, out)
    stream = runtime.raw_stream(dev)
    workspace = runtime.scratch(backend.workspace_bytes(m, n, k), out.device, stream)
    address = _pack_gemm(a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(), workspace,
                         m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld, runtime.out_kind(out.dtype), stream)  # fmt: skip
    if elsewhere:
        runtime.call_on_device(backend.launch, address, dev)
    else:
        backend.launch(address)
    return out


def run_wgrad(plan: WgradPlan, a, b, out, accumulate: bool = False) -> torch.Tensor:
    """``out`` (the plan's dtype, allocated when None) <- the planned weight-gradient GEMM of ``a`` [M, K] and ``b``
    [N, K] on the backend's ``wgrad_launch``, or with ``accumulate`` the product added into ``out``, in one launch."""
    backend, m, n, k, lda, ldb, a_scale, a_scale_ld, b_scale, b_scale_ld, out_dtype, dev, elsewhere = plan
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    stream = runtime.raw_stream(dev)
    workspace = runtime.scratch(backend.wgrad_workspace_bytes(m, n, k), out.device, stream)
    ldo = runtime.row_stride(out)
    address = _pack_wgrad(a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(),
                          workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld, int(accumulate),
                          runtime.out_kind(out.dtype), stream)  # fmt: skip
    if elsewhere:
        runtime.call_on_device(backend.wgrad_launch, address, dev)
    else:
        backend.wgrad_launch(address)
    return out


def launch_gemm(backend, a, b, a_scale, b_scale, out) -> None:
    """One GEMM of the GPU ``backend`` on operands checked elsewhere (M > 0, scales in its layouts) on the current
    device: what an in-process A/B of builds times (ci/gpu/inprocess_ab.py)."""
    (m, k), n = a.shape, b.shape[0]
    a_scale_ld, b_scale_ld = layout_ld(a_scale, backend.a_scale_layout), layout_ld(b_scale, backend.b_scale_layout)
    lda, dev = runtime.row_stride(a), runtime.device_index(a)
    plan = GemmPlan(backend, m, n, k, lda, b.stride(0), a_scale, a_scale_ld, b_scale, b_scale_ld, out.dtype, dev, False)
    run_gemm(plan, a, b, out)


def run_linear(plan: LinearPlan, x, weight, bias, pow2: bool) -> torch.Tensor:
    """``x @ dequant(weight).T + bias`` as [..., N] in x's dtype: x quantized per token, then the GEMM. The reference
    takes both steps in torch and a backend's linear entry in one call; any other backend quantizes with its kernel
    (the reference where it has none) into the scales' layout its GEMM reads, then launches its GEMM."""
    backend, in_kind, m, n, k, ldb, b_scale, b_scale_ld, out_dtype, dev, elsewhere = plan
    x2d = x if len(x.shape) == 2 else x.reshape(-1, k)
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m and backend is REFERENCE:
        q, scale = reference_quantize(x2d, weight.dtype, pow2)
        reference_gemm(q, weight, scale, b_scale, y)
    elif m and backend.linear is None:
        if backend.quantize is None:
            q, row_major = reference_quantize(x2d, weight.dtype, pow2)
            scale, scale_ld = runtime.empty_scale(m, k >> 7, backend.a_scale_layout, y.device)
            scale.copy_(row_major)
        else:
            q, scale, scale_ld = runtime.call_quantize(backend, x2d, pow2, dev, elsewhere)
        gemm = GemmPlan(backend, m, n, k, k, ldb, scale, scale_ld, b_scale, b_scale_ld, out_dtype, dev, elsewhere)
        runtime.call_gemm(gemm, q, weight, y)
    elif m:
        x2d = runtime.kernel_rows(x2d)
        stream = runtime.raw_stream(dev)
        workspace = runtime.scratch(backend.linear_workspace_bytes(m, n, k, in_kind), y.device, stream)
        address = _pack_linear(x2d.data_ptr(), weight.data_ptr(), b_scale.data_ptr(), y.data_ptr(), workspace, m, n,
                               k, x2d.stride(0), ldb, n, b_scale_ld, runtime.out_kind(out_dtype), in_kind, int(pow2),
                               stream)  # fmt: skip
        if elsewhere:
            runtime.call_on_device(backend.linear, address, dev)
        else:
            backend.linear(address)
    if bias is not None:
        y.add_(bias)
    if y.dtype is not x.dtype:
        y = y.to(x.dtype)
    return y if len(x.shape) == 2 else y.view(*x.shape[:-1], n)


def run_quantize(plan: QuantizePlan, x, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (FP8 [M, K], fp32 scales [M, K/128] in the plan's layout): the backend's kernel, else the
    reference."""
    kernel, fp8_dtype, layout, m, k, dev, elsewhere = plan
    x2d = x.reshape(-1, k)
    if kernel is None:
        q, scale = reference_quantize(x2d, fp8_dtype, pow2)
        if layout is not None:
            scale = runtime.empty_scale(m, k >> 7, layout, x.device)[0].copy_(scale)
        return q, scale
    q, scale, _ = runtime.call_quantize(kernel, x2d, pow2, dev, elsewhere)
    return q, scale


def run_grouped(plan: GroupedPlan, a, b, group_rows, out, expected_m: int = 0) -> torch.Tensor:
    """``out`` (allocated when None: zeros, as rows in no group read 0) <- each group's rows of ``a`` times its
    ``b``: the backend's grouped kernel where the plan has it, else the grouped reference."""
    (backend, layout, (groups, m, n, k), out_shape, out_dtype, kernel, a_scale, a_scale_ld, a_scale_group_stride,
     b_scale, b_scale_ld, b_scale_group_stride, dev, elsewhere) = plan  # fmt: skip
    if out is None:
        out = torch.zeros(out_shape, dtype=out_dtype, device=a.device)
    if not kernel:
        if m:
            reference_grouped(layout, a, b, a_scale, b_scale, group_rows, out)
        return out
    masked = layout == GROUPED_MASKED
    group_rows = group_rows.contiguous()  # a device-side copy at most: kernels read it as a plain int32 array
    stream = runtime.raw_stream(dev)
    workspace = runtime.scratch(backend.grouped_workspace_bytes(layout, m, n, k, groups), out.device, stream)
    lda, ldo = runtime.row_stride(a), runtime.row_stride(out)
    address = _pack_grouped(
        a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(), workspace,
        group_rows.data_ptr(), m, n, k, groups, lda, b.stride(1), ldo, a_scale_ld, b_scale_ld,
        runtime.group_stride(a, lda) if masked else 0, runtime.group_stride(b, b.stride(1)),
        runtime.group_stride(out, ldo) if masked else 0,
        a_scale_group_stride, b_scale_group_stride, expected_m, layout, runtime.out_kind(out.dtype), stream,
    )  # fmt: skip
    if elsewhere:
        runtime.call_on_device(backend.grouped_launch, address, dev)
    else:
        backend.grouped_launch(address)
    return out
