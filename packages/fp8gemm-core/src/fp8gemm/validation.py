"""Input checks and scale-layout conversion.

Every check works on metadata alone (shape, dtype, device, strides), so it also runs on fake tensors
under torch.compile. Each error names the argument and the fix.
"""

from __future__ import annotations

import functools

import torch

from .protocol import K_MAJOR, ScaleLayout
from .reference import BLOCK, FP8_DTYPES

OUT_DTYPES = (torch.bfloat16, torch.float32)
ALIGN_BYTES = 16  # TMA and 16-byte vector loads need it; demanded of every backend alike


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D, got shape {tuple(t.shape)}; flatten leading dims with .reshape(-1, t.shape[-1])"
        )


def _check_rows_layout(name: str, t: torch.Tensor, cols: int) -> None:
    """Row-major with unit column stride, row stride >= cols, 16-byte aligned rows."""
    rows = t.shape[0]
    if cols > 1 and t.stride(1) != 1:
        raise ValueError(
            f"{name} must be contiguous along its last dim (row-major, stride (ld, 1)); got strides "
            f"{tuple(t.stride())}. Pass {name}.contiguous()"
        )
    if rows > 1 and t.stride(0) < cols:
        raise ValueError(
            f"{name} row stride {t.stride(0)} is smaller than its row length {cols}; pass {name}.contiguous()"
        )
    if rows > 1 and (t.stride(0) * t.element_size()) % ALIGN_BYTES:
        raise ValueError(
            f"{name} row stride ({t.stride(0)} elements) must be a multiple of {ALIGN_BYTES} bytes; "
            f"pass {name}.contiguous()"
        )
    if t.device.type != "meta" and not _is_fake(t) and t.numel() and t.data_ptr() % ALIGN_BYTES:
        raise ValueError(f"{name} data pointer must be {ALIGN_BYTES}-byte aligned; pass {name}.clone()")


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor)


def check_inputs(a, b, a_scale, b_scale, out, out_dtype, fp8_dtype: str | None) -> torch.dtype:
    """Validate everything about one call; returns the output dtype."""
    for name, t in (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        check_tensor(name, t)
    if a.dtype not in FP8_DTYPES:
        raise TypeError(
            f"a must be FP8 ({', '.join(map(str, FP8_DTYPES))}), got {a.dtype}; "
            f"produce it with fp8gemm.quantize_activation(x)"
        )
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has {a.dtype}; quantize both to the same FP8 dtype")
    if fp8_dtype is not None and str(a.dtype) != f"torch.{fp8_dtype}":
        raise TypeError(
            f"a and b are {a.dtype}, but this device's backend takes torch.{fp8_dtype}; quantize with "
            f"fp8gemm.quantize_activation(x, fp8_dtype=torch.{fp8_dtype})"
        )
    for name, t in (("a_scale", a_scale), ("b_scale", b_scale)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be torch.float32, got {t.dtype}; pass {name}.float()")
    for name, t in (("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        if t.device != a.device:
            raise ValueError(f"{name} is on {t.device} but a is on {a.device}; move all inputs to one device")

    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(
            f"a is [M, K] = {tuple(a.shape)} and b is [N, K] = {tuple(b.shape)}: K differs (b is the nn.Linear weight, [out_features, in_features])"
        )
    if k == 0 or k % BLOCK:
        raise ValueError(f"K = {k} must be a positive multiple of {BLOCK} (the scale block); pad K with zeros")
    if n == 0 or n % 16:
        raise ValueError(f"N = {n} (b.shape[0]) must be a positive multiple of 16; pad the weight's rows with zeros")
    kb = k // BLOCK
    if tuple(a_scale.shape) != (m, kb):
        raise ValueError(
            f"a_scale must be [M, K/128] = [{m}, {kb}] (one scale per token per 128 of K), got {tuple(a_scale.shape)}"
        )
    if tuple(b_scale.shape) != (ceil_div(n, BLOCK), kb):
        raise ValueError(
            f"b_scale must be [ceil(N/128), K/128] = [{ceil_div(n, BLOCK)}, {kb}] (one scale per 128x128 "
            f"block), got {tuple(b_scale.shape)}"
        )
    _check_rows_layout("a", a, k)
    _check_rows_layout("b", b, k)
    return _check_out(out, out_dtype, a, m, n)


def _check_out(out, out_dtype, a, m: int, n: int) -> torch.dtype:
    if out is None:
        dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if dtype not in OUT_DTYPES:
            raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {dtype}")
        return dtype
    check_tensor("out", out)
    if out_dtype is not None and out_dtype != out.dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype={out_dtype}; drop out_dtype or make them agree")
    if out.dtype not in OUT_DTYPES:
        raise TypeError(f"out must be torch.bfloat16 or torch.float32, got {out.dtype}")
    if out.device != a.device:
        raise ValueError(f"out is on {out.device} but the inputs are on {a.device}")
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out must be [M, N] = [{m}, {n}], got {tuple(out.shape)}")
    _check_rows_layout("out", out, n)
    return out.dtype


@functools.cache
def ld_reader(layout: ScaleLayout):
    """``read(strides, rows, cols)``: the leading dimension of a scale matrix with those strides if it
    already has ``layout``, else None. Built once per layout: ``gemm``'s fast path calls it per call."""
    mult = layout.ld_multiple
    inner = 1 if layout.order == K_MAJOR else 0  # the dimension that must be contiguous
    outer = 1 - inner

    def read(strides, rows, cols):
        extent, other = (cols, rows) if inner else (rows, cols)
        if extent > 1 and strides[inner] != 1:
            return None
        ld = strides[outer] if other > 1 else max(strides[outer], extent)
        return None if ld < extent or ld % mult else ld

    return read


def layout_ld(scale: torch.Tensor, layout: ScaleLayout) -> int | None:
    """The leading dimension if ``scale`` already has ``layout``, else None."""
    rows, cols = scale.shape
    return ld_reader(layout)(scale.stride(), rows, cols)


def conform_scale(scale: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, int]:
    """``scale`` in ``layout`` (no copy when it already is) and its leading dimension."""
    ld = layout_ld(scale, layout)
    if ld is not None:
        return scale, ld
    rows, cols = scale.shape
    if layout.order == K_MAJOR:
        ld = ceil_div(cols, layout.ld_multiple) * layout.ld_multiple
        buf = scale.new_empty((rows, ld))
        buf[:, :cols] = scale
        return buf[:, :cols], ld
    ld = ceil_div(rows, layout.ld_multiple) * layout.ld_multiple
    buf = scale.new_empty((cols, ld))
    buf[:, :rows] = scale.t()
    return buf[:, :rows].t(), ld
