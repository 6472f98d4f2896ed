"""The plan of one grouped call (``grouped_gemm``, ``grouped_gemm_masked``): the backend resolved once, every input
checked once, the scales in the layout its kernel reads; and per-group scale layouts.

Like :mod:`validation`, every check of a tensor's metadata works on fake tensors too. Values of ``offs``,
``m_indices`` and ``masked_m`` are read only where that costs no device synchronisation (see :func:`host_can_read`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import registry, runtime
from .protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS, K_MAJOR, ScaleLayout
from .reference import BLOCK, REFERENCE
from .validation import ALIGN_BYTES, OUT_DTYPES, ceil_div, check_fp8, check_same_device, conform_scale, ld_reader

GROUPED_NAMES = ("a", "b", "a_scale", "b_scale")
ROW_MAP_NAMES = {GROUPED_CONTIGUOUS: "offs", GROUPED_ROW_IDS: "m_indices", GROUPED_MASKED: "masked_m"}
SCALE_ALIGN = ALIGN_BYTES // 4  # fp32 elements per 16 bytes: each group's scales start 16-byte aligned


class GroupedShape(NamedTuple):
    groups: int
    m: int  # rows of a in all (contiguous, row ids) or per group (masked: M_max)
    n: int
    k: int


class GroupedPlan(NamedTuple):
    """One checked grouped call: what its run reads besides the tensors. Built as a plain tuple of these fields, in
    this order, as the fast plans of ``plans`` are: grouped calls and the MoE layer's take this path every time."""

    backend: object  # the Backend that runs on a's device, or REFERENCE
    layout: int  # protocol.GROUPED_*: what the row map (offs, m_indices or masked_m) is
    shape: GroupedShape
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    kernel: bool  # the backend's grouped kernel runs (M > 0 and it has this layout); else the grouped reference
    a_scale: torch.Tensor  # for the kernel, in the backend's layout; as passed for the reference
    a_scale_ld: int
    a_scale_group_stride: int
    b_scale: torch.Tensor
    b_scale_ld: int
    b_scale_group_stride: int
    device: int  # a's device index (runtime.device_index)
    elsewhere: bool  # it is not the current device: the launch makes it current


def plan_grouped(layout: int, a, b, a_scale, b_scale, group_rows, out, out_dtype, backend_name, eager: bool):
    """Every check of one grouped call, once, against the backend for a's device; ``eager``: an eager call, which
    may copy ``offs`` to the host to check its values."""
    if not isinstance(a, torch.Tensor):  # its device picks the backend
        raise TypeError(f"a must be a torch.Tensor, got {type(a).__name__}")
    backend = registry.select(a.device, backend_name or None).backend
    fp8_dtype = None if backend is REFERENCE else backend.fp8_dtype
    shape, out_shape, dtype = check_grouped(
        layout, a, b, a_scale, b_scale, group_rows, out, out_dtype, fp8_dtype, eager
    )
    return launch_plan(backend, layout, shape, out_shape, dtype, a, a_scale, b_scale)


def launch_plan(backend, layout: int, shape: GroupedShape, out_shape, out_dtype, a, a_scale, b_scale) -> GroupedPlan:
    """The plan of a grouped call on operands already checked (by :func:`check_grouped`, or by ``fused_experts``):
    the kernel's scales conformed to its layout."""
    if not shape.m or not uses_grouped_kernel(backend, layout):
        return backend, layout, shape, out_shape, out_dtype, False, a_scale, 0, 0, b_scale, 0, 0, -1, False
    if layout == GROUPED_MASKED:
        a_scale, a_scale_ld, a_scale_group_stride = conform_group_scale(a_scale, backend.a_scale_layout)
    else:
        (a_scale, a_scale_ld), a_scale_group_stride = conform_scale(a_scale, backend.a_scale_layout), 0
    b_scale, b_scale_ld, b_scale_group_stride = conform_group_scale(b_scale, backend.b_scale_layout)
    dev = runtime.device_index(a)
    return (backend, layout, shape, out_shape, out_dtype, True, a_scale, a_scale_ld, a_scale_group_stride, b_scale,
            b_scale_ld, b_scale_group_stride, dev, runtime.switch_needed(dev))  # fmt: skip


def uses_grouped_kernel(backend, layout: int) -> bool:
    return getattr(backend, "grouped_launch", None) is not None and layout in backend.grouped_layouts


def check_grouped(layout: int, a, b, a_scale, b_scale, group_rows, out, out_dtype, fp8_dtype: str | None,
                  eager: bool = False):  # fmt: skip
    """Every check of one grouped call: ``(shape, out_shape, out dtype)``. Metadata always; values where the host
    sees them without a device synchronisation (:func:`check_values`)."""
    masked = layout == GROUPED_MASKED
    shape = check_grouped_operands(a, b, a_scale, b_scale, fp8_dtype, masked)
    name = ROW_MAP_NAMES[layout]
    if layout == GROUPED_ROW_IDS:
        check_group_rows(name, group_rows, shape.m, "M")
    else:
        check_group_rows(name, group_rows, shape.groups, "G")
    check_values(layout, group_rows, shape, eager)
    check_same_device("a", a, **{name: group_rows})
    out_shape = (shape.groups, shape.m, shape.n) if masked else (shape.m, shape.n)
    return shape, out_shape, check_out(out, out_dtype, out_shape, a)


def has_storage(t: torch.Tensor) -> bool:
    """False for meta and fake tensors (torch.compile's tracing): their pointers and values cannot be read."""
    return t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)


def check_dims(name: str, t, dims: int, what: str, fix: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D {what}, got shape {tuple(t.shape)}{fix}")


def check_rows(name: str, t: torch.Tensor) -> None:
    """The last dim contiguous; rows, and groups (a leading dim), a multiple of 16 bytes apart; aligned start."""
    rows, cols = t.shape[-2], t.shape[-1]
    size = t.element_size()
    if cols > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous along its last dim (strides (..., ld, 1)); got strides {tuple(t.stride())}. "
            f"Pass {name}.contiguous()"
        )
    if rows > 1 and (t.stride(-2) < cols or (t.stride(-2) * size) % ALIGN_BYTES):
        raise ValueError(
            f"{name} row stride ({t.stride(-2)} elements) must be at least its row length {cols} and a multiple of "
            f"{ALIGN_BYTES} bytes; pass {name}.contiguous()"
        )
    if t.dim() == 3 and t.shape[0] > 1 and (t.stride(0) * size) % ALIGN_BYTES:
        raise ValueError(
            f"{name} group stride ({t.stride(0)} elements) must be a multiple of {ALIGN_BYTES} bytes; "
            f"pass {name}.contiguous()"
        )
    if has_storage(t) and t.numel() and t.data_ptr() % ALIGN_BYTES:
        raise ValueError(f"{name} data pointer must be {ALIGN_BYTES}-byte aligned; pass {name}.clone()")


def check_scale_shape(name: str, t, shape: tuple[int, ...], what: str) -> None:
    check_dims(name, t, len(shape), what)
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be torch.float32, got {t.dtype}; pass {name}.float()")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {what} = {list(shape)}, got {tuple(t.shape)}")


def check_grouped_operands(a, b, a_scale, b_scale, fp8_dtype: str | None, masked: bool) -> GroupedShape:
    """a [M, K] (or [G, M_max, K] when ``masked``), b [G, N, K], their scales; all on one device."""
    if masked:
        check_dims("a", a, 3, "[G, M_max, K]", "; for rows grouped along one M use fp8gemm.grouped_gemm")
    else:
        check_dims("a", a, 2, "[M, K] (rows grouped by expert)", "; for [G, M_max, K] use fp8gemm.grouped_gemm_masked")
    check_fp8("a", a, "produce it with fp8gemm.quantize_activation(x)")
    k = a.shape[-1]
    if k == 0 or k % BLOCK:
        raise ValueError(f"K = {k} must be a positive multiple of {BLOCK} (the scale block); pad K with zeros")
    check_dims("b", b, 3, "[G, N, K] (one [N, K] weight per expert)", "; stack the experts' weights: torch.stack(ws)")
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has {a.dtype}; quantize both to the same FP8 dtype")
    if fp8_dtype is not None and str(a.dtype) != f"torch.{fp8_dtype}":
        raise TypeError(
            f"a and b are {a.dtype}, but this device's backend takes torch.{fp8_dtype}; quantize with "
            f"fp8gemm.quantize_activation(x, fp8_dtype=torch.{fp8_dtype})"
        )
    groups, n, b_k = b.shape
    if b_k != k:
        raise ValueError(f"b is [G, N, K] = {tuple(b.shape)} but a has K = {k}: K differs")
    if groups == 0:
        raise ValueError("b holds no group (b.shape[0] = G = 0); pass at least one expert's weight")
    if n == 0 or n % 16:
        raise ValueError(f"N = {n} (b.shape[1]) must be a positive multiple of 16; pad the weights' rows with zeros")
    if masked and a.shape[0] != groups:
        raise ValueError(f"a is [G, M_max, K] = {tuple(a.shape)} but b holds G = {groups} groups (b.shape[0])")
    m = a.shape[-2]
    kb = k // BLOCK
    a_what = "[G, M_max, K/128]" if masked else "[M, K/128]"
    check_scale_shape("a_scale", a_scale, (*a.shape[:-1], kb), f"{a_what} (one scale per row per 128 of K)")
    b_what = "[G, ceil(N/128), K/128] (one scale per 128x128 block)"
    check_scale_shape("b_scale", b_scale, (groups, ceil_div(n, BLOCK), kb), b_what)
    check_same_device("a", a, b=b, a_scale=a_scale, b_scale=b_scale)
    check_rows("a", a)
    check_rows("b", b)
    return GroupedShape(groups, m, n, k)


def check_group_rows(name: str, t, length: int, length_what: str) -> None:
    """An int32 1-D index tensor of ``length`` entries."""
    check_dims(name, t, 1, f"int32 [{length_what}]")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32, got {t.dtype}; pass {name}.to(torch.int32)")
    if t.shape[0] != length:
        raise ValueError(f"{name} must have {length_what} = {length} entries, got {t.shape[0]}")


def pick_row_map(offs, m_indices) -> tuple[int, torch.Tensor]:
    """Which of ``offs`` / ``m_indices`` the caller passed (exactly one): its layout (protocol.GROUPED_*) and it."""
    if (offs is None) == (m_indices is None):
        given = "both" if offs is not None else "neither"
        raise ValueError(
            f"pass exactly one of offs (int32 [G] cumulative row ends, PyTorch's convention) or m_indices "
            f"(int32 [M] each row's expert, -1 to skip it, DeepGEMM's); got {given}"
        )
    return (GROUPED_CONTIGUOUS, offs) if offs is not None else (GROUPED_ROW_IDS, m_indices)


def check_expected_m(expected_m) -> int:
    if expected_m is None:
        return 0
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise TypeError(
            f"expected_m must be an int (a hint of rows per group) or None, got {type(expected_m).__name__}"
        )
    if expected_m < 0:
        raise ValueError(f"expected_m must be >= 0 (a hint of rows per group), got {expected_m}")
    return expected_m


def check_out(out, out_dtype, shape: tuple[int, ...], a: torch.Tensor) -> torch.dtype:
    """``out`` (or ``out_dtype`` for a new one): bf16/fp32 of ``shape`` on a's device, rows as for a."""
    if out is None:
        dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if dtype not in OUT_DTYPES:
            raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {dtype}")
        return dtype
    what = "[G, M_max, N]" if len(shape) == 3 else "[M, N]"
    check_dims("out", out, len(shape), what)
    if out_dtype is not None and out_dtype != out.dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype={out_dtype}; drop out_dtype or make them agree")
    if out.dtype not in OUT_DTYPES:
        raise TypeError(f"out must be torch.bfloat16 or torch.float32, got {out.dtype}")
    if out.device != a.device:
        raise ValueError(f"out is on {out.device} but the inputs are on {a.device}; move all inputs to one device")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must be {what} = {list(shape)}, got {tuple(out.shape)}")
    check_rows("out", out)
    if len(shape) == 3 and shape[0] > 1 and shape[1] and out.stride(0) < shape[1] * out.stride(1):
        raise ValueError(f"out's groups overlap (strides {tuple(out.stride())}); pass a tensor from torch.empty")
    return out.dtype


# --- values: read on the host only where no device synchronisation results --------------------------------------


def check_values(layout: int, group_rows: torch.Tensor, shape: GroupedShape, eager: bool) -> None:
    """Values the host sees without a device synchronisation: CPU tensors; for offs, an eager call's (one copy)."""
    if not host_can_read(group_rows, eager and layout == GROUPED_CONTIGUOUS):
        return
    if layout == GROUPED_CONTIGUOUS:
        check_offs_values(group_rows, shape.m)
    elif layout == GROUPED_MASKED:
        check_masked_m_values(group_rows, shape.m)
    else:
        check_m_indices_values(group_rows, shape.groups)


def host_can_read(t: torch.Tensor, eager: bool) -> bool:
    """CPU values always; a GPU tensor's only for an eager call outside CUDA-graph capture (one small copy)."""
    if t.device.type == "cpu":
        return has_storage(t)
    if not eager or not has_storage(t):
        return False
    return t.device.type != "cuda" or not runtime.capturing()


def check_offs_values(offs: torch.Tensor, m: int) -> None:
    ends = offs.tolist() if offs.device.type == "cpu" else offs.cpu().tolist()  # one copy of G integers
    if ends and ends[0] < 0:
        raise ValueError(f"offs[0] = {ends[0]} is negative; offs holds cumulative row ends, each in [0, M = {m}]")
    for g in range(1, len(ends)):
        if ends[g] < ends[g - 1]:
            raise ValueError(
                f"offs must be non-decreasing (cumulative row ends: group g is rows [offs[g-1], offs[g])), got "
                f"offs[{g}] = {ends[g]} < offs[{g - 1}] = {ends[g - 1]}; pass torch.cumsum(rows_per_group, 0)"
            )
    if ends and ends[-1] > m:
        raise ValueError(
            f"offs[-1] = {ends[-1]} is past M = {m} (a.shape[0]): a group would end past a's last row; offs[-1] "
            f"may be at most M (rows past it are not written)"
        )


def check_m_indices_values(m_indices: torch.Tensor, groups: int) -> None:
    if m_indices.numel() and (int(m_indices.min()) < -1 or int(m_indices.max()) >= groups):
        bad = m_indices[(m_indices < -1) | (m_indices >= groups)][0]
        raise ValueError(
            f"m_indices holds {int(bad)}, outside [-1, G = {groups}): each row's expert is in [0, G), or -1 to skip it"
        )


def check_masked_m_values(masked_m: torch.Tensor, m_max: int) -> None:
    if masked_m.numel() and (int(masked_m.min()) < 0 or int(masked_m.max()) > m_max):
        bad = masked_m[(masked_m < 0) | (masked_m > m_max)][0]
        raise ValueError(f"masked_m holds {int(bad)}, outside [0, M_max = {m_max}] (a.shape[1]): rows per group")


# --- per-group scale layouts -------------------------------------------------------------------------------------


def group_scale_layout(scale: torch.Tensor, layout: ScaleLayout) -> tuple[int, int] | None:
    """``(ld, group_stride)`` when every group of the 3-D ``scale`` is in ``layout`` with a 16-byte aligned start."""
    groups, rows, cols = scale.shape
    ld = ld_reader(layout)(scale.stride()[1:], rows, cols)
    group_stride = scale.stride(0)
    if ld is None or (groups > 1 and group_stride % SCALE_ALIGN):
        return None
    if has_storage(scale) and scale.data_ptr() % ALIGN_BYTES:
        return None
    if groups == 1:  # never applied, but a kernel's tensor map still wants it 16-byte aligned
        group_stride = ceil_div((rows if layout.order == K_MAJOR else cols) * ld, SCALE_ALIGN) * SCALE_ALIGN
    return ld, group_stride


def conform_group_scale(scale: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, int, int]:
    """The 3-D ``scale`` [G, rows, cols] with every group in ``layout`` (a copy only when it is not), its leading
    dimension and its group stride (elements, a multiple of 16 bytes)."""
    found = group_scale_layout(scale, layout)
    if found is not None:
        return scale, *found
    groups, rows, cols = scale.shape
    if layout.order == K_MAJOR:
        ld = max(ceil_div(cols, layout.ld_multiple) * layout.ld_multiple, 1)
        inner = (ld, 1)
        per_group = rows * ld
    else:
        ld = max(ceil_div(rows, layout.ld_multiple) * layout.ld_multiple, layout.ld_multiple)
        inner = (1, ld)
        per_group = cols * ld
    group_stride = ceil_div(per_group, SCALE_ALIGN) * SCALE_ALIGN
    flat = scale.new_empty(groups * group_stride)
    conformed = flat.as_strided((groups, rows, cols), (group_stride, *inner))
    conformed.copy_(scale)
    return conformed, ld, group_stride
