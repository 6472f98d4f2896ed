"""Input checks and scale-layout conversion.

Every check works on metadata alone (shape, dtype, device, strides), so it also runs on fake tensors
under torch.compile. Each error names the argument and the fix. The planners (``plans``) call them once per
call; the ops' fake implementations call them for torch.compile.
"""

from __future__ import annotations

import functools

import torch

from .protocol import K_MAJOR, ScaleLayout
from .reference import BLOCK, FP8_DTYPES

IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what linear and quantize_activation take
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


GEMM_NAMES = ("a", "b", "a_scale", "b_scale")


def check_fp8(name: str, t: torch.Tensor, fix: str) -> None:
    if t.dtype not in FP8_DTYPES:
        raise TypeError(f"{name} must be FP8 ({', '.join(map(str, FP8_DTYPES))}), got {t.dtype}; {fix}")


def check_scale(name: str, t, shape: tuple[int, int], what: str) -> None:
    check_tensor(name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be torch.float32, got {t.dtype}; pass {name}.float()")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {what} = [{shape[0]}, {shape[1]}], got {tuple(t.shape)}")


def check_same_device(reference_name: str, reference: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != reference.device:
            raise ValueError(
                f"{name} is on {t.device} but {reference_name} is on {reference.device}; move all inputs to one device"
            )


def per_row_scale(b, b_scale) -> bool:
    """Whether ``b_scale`` is [N, K/128], one scale per row of ``b`` per 128 of K (the weight-gradient, "1D1D" form),
    rather than one per 128x128 block; with N == 1 the two shapes coincide and count as per block (same numbers)."""
    if not isinstance(b, torch.Tensor) or not isinstance(b_scale, torch.Tensor) or b.dim() != 2 or b_scale.dim() != 2:
        return False
    n = b.shape[0]
    return b_scale.shape[0] == n and n != ceil_div(n, BLOCK)


def check_weight(b, b_scale, k: int, names: tuple[str, str] = ("b", "b_scale"), per_row: bool = False) -> None:
    """The FP8 weight [N, K] and its block scales [ceil(N/128), K/128] (``per_row``: [N, K/128]), reported under the
    caller's names."""
    b_name, scale_name = names
    check_tensor(b_name, b)
    check_fp8(b_name, b, "quantize it with fp8gemm.quantize_weight (or use fp8gemm.nn.Fp8Linear)")
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(
            f"{b_name} is [N, K] = {tuple(b.shape)} but the activations have K = {k}: K differs ({b_name} is the "
            f"nn.Linear weight, [out_features, in_features])"
        )
    if n == 0 or n % 16:
        raise ValueError(
            f"N = {n} ({b_name}.shape[0]) must be a positive multiple of 16; pad the weight's rows with zeros"
        )
    if per_row:
        check_scale(scale_name, b_scale, (n, k // BLOCK), "[N, K/128] (one scale per row per 128 of K)")
    else:
        check_scale(
            scale_name, b_scale, (ceil_div(n, BLOCK), k // BLOCK), "[ceil(N/128), K/128] (one scale per 128x128 block)"
        )
    _check_rows_layout(b_name, b, k)


def check_inputs(a, b, a_scale, b_scale, out, out_dtype, fp8_dtype: str | None, names=GEMM_NAMES) -> torch.dtype:
    """Validate everything about one GEMM call; returns the output dtype. ``names``: the caller's argument names."""
    a_name, b_name, a_scale_name, b_scale_name = names
    check_tensor(a_name, a)
    check_fp8(a_name, a, "produce it with fp8gemm.quantize_activation(x)")
    m, k = a.shape
    if k == 0 or k % BLOCK:
        raise ValueError(f"K = {k} must be a positive multiple of {BLOCK} (the scale block); pad K with zeros")
    check_tensor(b_name, b)
    if b.dtype != a.dtype:
        raise TypeError(f"{b_name} has dtype {b.dtype} but {a_name} has {a.dtype}; quantize both to the same FP8 dtype")
    if fp8_dtype is not None and str(a.dtype) != f"torch.{fp8_dtype}":
        raise TypeError(
            f"{a_name} and {b_name} are {a.dtype}, but this device's backend takes torch.{fp8_dtype}; quantize with "
            f"fp8gemm.quantize_activation(x, fp8_dtype=torch.{fp8_dtype})"
        )
    check_scale(a_scale_name, a_scale, (m, k // BLOCK), "[M, K/128] (one scale per token per 128 of K)")
    check_tensor(b_scale_name, b_scale)
    check_same_device(a_name, a, **{b_name: b, a_scale_name: a_scale, b_scale_name: b_scale})
    per_row = per_row_scale(b, b_scale)
    check_weight(b, b_scale, k, (b_name, b_scale_name), per_row)
    _check_rows_layout(a_name, a, k)
    return _check_out(out, out_dtype, a, m, b.shape[0])


def check_accumulate(out, accumulate: bool) -> None:
    """``accumulate=True`` adds the product into a float32 ``out=``; anything else is refused with the fix."""
    if not accumulate:
        return
    if out is None:
        raise ValueError("accumulate=True adds the product into out, but no out= was given; pass out=<float32 [M, N]>")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(
            f"accumulate=True needs a torch.float32 out (sums of products lose precision in {got}); accumulate into a "
            f"float32 buffer and cast it once at the end"
        )


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


def check_linear(x, weight, weight_scale, bias) -> None:
    """Every argument of ``linear`` checked on metadata alone, each error under the caller's name."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [..., K], got {type(x).__name__}")
    if x.dtype not in IN_DTYPES:
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [..., K], got {x.dtype}")
    check_tensor("weight", weight)
    check_fp8("weight", weight, "quantize it with fp8gemm.quantize_weight or use fp8gemm.nn.Fp8Linear")
    n, k = weight.shape
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(
            f"x's last dim must equal weight's in_features: x is {tuple(x.shape)}, weight is [N, K] = {(n, k)}"
        )
    if k == 0 or k % BLOCK:
        raise ValueError(f"K = {k} (weight.shape[1]) must be a positive multiple of {BLOCK}; pad K with zeros")
    check_weight(weight, weight_scale, k, ("weight", "weight_scale"))
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
            got = bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point tensor [N] = [{n}] or None, got {got}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be [N] = [{n}], got {tuple(bias.shape)}")
    check_same_device("x", x, weight=weight, weight_scale=weight_scale, bias=bias)


def check_source(name: str, x) -> None:
    """A float tensor [..., K] to quantize, K a positive multiple of 128."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in IN_DTYPES:
        raise TypeError(f"{name} must be a bfloat16/float16/float32 tensor, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % BLOCK:
        k = x.shape[-1] if x.dim() else None
        raise ValueError(f"{name}'s last dim (K = {k}) must be a positive multiple of {BLOCK}; pad it with zeros")


def check_fp8_dtype(fp8_dtype) -> float:
    """``fp8_dtype`` is one of the FP8 dtypes; returns its largest finite value."""
    if not isinstance(fp8_dtype, torch.dtype):
        raise TypeError(f"fp8_dtype must be a torch.dtype, got {fp8_dtype!r}")
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {', '.join(map(str, FP8_DTYPES))}, got {fp8_dtype}")
    return torch.finfo(fp8_dtype).max


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
    """``scale`` in ``layout`` with a 16-byte aligned start (no copy when it already is), and its leading dimension.

    A slice of a scale tensor (the rows of one expert, one token) may start anywhere: it is copied, not refused."""
    ld = layout_ld(scale, layout)
    if ld is not None and (_is_fake(scale) or scale.device.type == "meta" or scale.data_ptr() % ALIGN_BYTES == 0):
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
