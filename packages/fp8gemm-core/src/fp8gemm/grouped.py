"""``fp8gemm.grouped_gemm`` and ``fp8gemm.grouped_gemm_masked``: one GEMM per expert of a mixture of experts, in one
call. Checks, backend dispatch, and the torch.library ops for torch.compile and CUDA graphs (docs/grouped.md)."""

from __future__ import annotations

import torch

from . import registry, runtime
from .grouped_checks import (
    GROUPED_NAMES,
    GroupedShape,
    check_group_rows,
    check_grouped_operands,
    check_m_indices_values,
    check_masked_m_values,
    check_offs_values,
    check_out,
    conform_group_scale,
    host_can_read,
    pick_row_map,
)
from .grouped_reference import reference_grouped
from .protocol import GROUPED_ARGS, GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS
from .reference import REFERENCE
from .runtime import LIBRARY
from .validation import conform_scale

ROW_MAP_LAYOUTS = {"offs": GROUPED_CONTIGUOUS, "m_indices": GROUPED_ROW_IDS}


def check_grouped(layout: int, a, b, a_scale, b_scale, group_rows, out, out_dtype, fp8_dtype: str | None):
    """Every check of one grouped call on metadata alone: ``(shape, out_shape, out dtype)``."""
    masked = layout == GROUPED_MASKED
    shape = check_grouped_operands(a, b, a_scale, b_scale, fp8_dtype, masked)
    if layout == GROUPED_ROW_IDS:
        check_group_rows("m_indices", group_rows, shape.m, "M", a)
    else:
        check_group_rows("masked_m" if masked else "offs", group_rows, shape.groups, "G", a)
    out_shape = (shape.groups, shape.m, shape.n) if masked else (shape.m, shape.n)
    return shape, out_shape, check_out(out, out_dtype, out_shape, a)


def _check_values(layout: int, group_rows: torch.Tensor, shape: GroupedShape, eager: bool) -> None:
    """Values the host sees without a device synchronisation: CPU tensors; for offs, an eager call's (one copy)."""
    if not host_can_read(group_rows, eager and layout == GROUPED_CONTIGUOUS):
        return
    if layout == GROUPED_CONTIGUOUS:
        check_offs_values(group_rows, shape.m)
    elif layout == GROUPED_MASKED:
        check_masked_m_values(group_rows, shape.m)
    else:
        check_m_indices_values(group_rows, shape.groups)


def uses_grouped_kernel(backend, layout: int) -> bool:
    return getattr(backend, "grouped_launch", None) is not None and layout in backend.grouped_layouts


def launch_grouped(backend, layout: int, shape: GroupedShape, a, b, a_scale, b_scale, group_rows, out, expected_m):
    """One ``grouped_launch`` on checked operands (scales conformed here), on the current device and stream."""
    masked = layout == GROUPED_MASKED
    if masked:
        a_scale, a_scale_ld, a_scale_group_stride = conform_group_scale(a_scale, backend.a_scale_layout)
    else:
        (a_scale, a_scale_ld), a_scale_group_stride = conform_scale(a_scale, backend.a_scale_layout), 0
    b_scale, b_scale_ld, b_scale_group_stride = conform_group_scale(b_scale, backend.b_scale_layout)
    group_rows = group_rows.contiguous()  # a device-side copy at most: kernels read it as a plain int32 array
    groups, m, n, k = shape
    stream = runtime.raw_stream(a.device.index)
    workspace = runtime.scratch(backend.grouped_workspace_bytes(layout, m, n, k, groups), a.device, stream)
    backend.grouped_launch(GROUPED_ARGS.pack(
        a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(), workspace,
        group_rows.data_ptr(), m, n, k, groups, a.stride(-2), b.stride(1), out.stride(-2), a_scale_ld, b_scale_ld,
        a.stride(0) if masked else 0, b.stride(0), out.stride(0) if masked else 0, a_scale_group_stride,
        b_scale_group_stride, expected_m, layout, runtime.out_kind(out.dtype), stream,
    ))  # fmt: skip


def run_grouped(backend_name, layout: int, a, b, a_scale, b_scale, group_rows, out, out_dtype, expected_m: int = 0,
                eager: bool = False) -> torch.Tensor:  # fmt: skip
    """Check, pick the backend, allocate ``out`` (zeros: rows in no group read 0) if needed, run on a's device.
    ``eager``: an eager call, which may copy ``offs`` to the host to check its values."""
    if not isinstance(a, torch.Tensor):  # its device picks the backend
        raise TypeError(f"a must be a torch.Tensor, got {type(a).__name__}")
    backend = registry.select(a.device, backend_name or None).backend
    fp8_dtype = None if backend is REFERENCE else backend.fp8_dtype
    shape, out_shape, dtype = check_grouped(layout, a, b, a_scale, b_scale, group_rows, out, out_dtype, fp8_dtype)
    _check_values(layout, group_rows, shape, eager)
    if out is None:
        out = torch.zeros(out_shape, dtype=dtype, device=a.device)
    if shape.m:
        run_checked_grouped(backend, layout, shape, a, b, a_scale, b_scale, group_rows, out, expected_m)
    return out


def run_checked_grouped(backend, layout: int, shape: GroupedShape, a, b, a_scale, b_scale, group_rows, out,
                        expected_m: int = 0) -> None:  # fmt: skip
    """Checked operands of M > 0 rows to ``backend``'s grouped kernel on a's device where it has ``layout``, else
    to the grouped reference."""
    if uses_grouped_kernel(backend, layout):
        with runtime.on_device(a.device):
            launch_grouped(backend, layout, shape, a, b, a_scale, b_scale, group_rows, out, expected_m)
    else:
        reference_grouped(layout, a, b, a_scale, b_scale, group_rows, out)


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


# --- torch.library ops: what torch.compile and graph capture see -------------------------------------------------


@runtime.op("grouped_gemm", "grouped_gemm", GROUPED_NAMES)
def _grouped_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                offs: torch.Tensor | None, m_indices: torch.Tensor | None, out_dtype: torch.dtype,
                backend: str) -> torch.Tensor:  # fmt: skip
    name, rows = pick_row_map(offs, m_indices)
    return run_grouped(backend, ROW_MAP_LAYOUTS[name], a, b, a_scale, b_scale, rows, None, out_dtype)


@_grouped_op.register_fake
def _(a, b, a_scale, b_scale, offs, m_indices, out_dtype, backend):
    name, rows = pick_row_map(offs, m_indices)
    _, out_shape, dtype = check_grouped(ROW_MAP_LAYOUTS[name], a, b, a_scale, b_scale, rows, None, out_dtype, None)
    return a.new_empty(out_shape, dtype=dtype)


@runtime.op("grouped_gemm_out", "grouped_gemm", GROUPED_NAMES, mutates_args=("out",))
def _grouped_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                    offs: torch.Tensor | None, m_indices: torch.Tensor | None, out: torch.Tensor,
                    backend: str) -> None:  # fmt: skip
    name, rows = pick_row_map(offs, m_indices)
    run_grouped(backend, ROW_MAP_LAYOUTS[name], a, b, a_scale, b_scale, rows, out, None)


@_grouped_out_op.register_fake
def _(a, b, a_scale, b_scale, offs, m_indices, out, backend):
    name, rows = pick_row_map(offs, m_indices)
    check_grouped(ROW_MAP_LAYOUTS[name], a, b, a_scale, b_scale, rows, out, None, None)


@runtime.op("grouped_gemm_masked", "grouped_gemm_masked", GROUPED_NAMES)
def _masked_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
               masked_m: torch.Tensor, expected_m: int, out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    return run_grouped(backend, GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, None, out_dtype, expected_m)


@_masked_op.register_fake
def _(a, b, a_scale, b_scale, masked_m, expected_m, out_dtype, backend):
    _, out_shape, dtype = check_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, None, out_dtype, None)
    return a.new_empty(out_shape, dtype=dtype)


@runtime.op("grouped_gemm_masked_out", "grouped_gemm_masked", GROUPED_NAMES, mutates_args=("out",))
def _masked_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                   masked_m: torch.Tensor, expected_m: int, out: torch.Tensor, backend: str) -> None:  # fmt: skip
    run_grouped(backend, GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, out, None, expected_m)


@_masked_out_op.register_fake
def _(a, b, a_scale, b_scale, masked_m, expected_m, out, backend):
    check_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, out, None, None)


_ops = getattr(torch.ops, LIBRARY)


def grouped_gemm(a, b, a_scale, b_scale, offs=None, *, m_indices=None, out=None, out_dtype=None,
                 backend: str | None = None) -> torch.Tensor:  # fmt: skip
    """One GEMM per expert over rows grouped by expert: ``out[r] = a[r] @ b[g].T`` (block-scaled as ``gemm``) for
    every row ``r`` of group ``g``.

    a: FP8 [M, K], rows grouped by expert; b: FP8 [G, N, K], one nn.Linear weight per expert (same FP8 dtype).
    a_scale: fp32 [M, K/128]; b_scale: fp32 [G, ceil(N/128), K/128], any layout per group (``prepare_weight_scale``
    converts it once into the one the backend reads). Which rows belong to which group, exactly one of:

    * ``offs``: int32 [G] cumulative row ends on a's device (PyTorch's ``_grouped_mm`` convention): group g is rows
      ``[offs[g-1], offs[g])`` (group 0 starts at 0). Any group size, 0 included; no padding; ``offs[-1] <= M``.
    * ``m_indices``: int32 [M] each row's expert (DeepGEMM's convention), -1 for a row to skip.

    Rows in no group (past ``offs[-1]``, or with id -1) are not written: ``out=`` keeps what it held there, and the
    functional call returns zeros there. out_dtype: torch.bfloat16 (default) or torch.float32.

    Values are checked where the host sees them without a device synchronisation: ``offs`` / ``m_indices`` on the
    CPU, and ``offs`` on a GPU in an eager call outside CUDA-graph capture (one copy of G integers; inside
    torch.compile or capture nothing is read). Values only the device sees never make it read or write outside the
    tensors: group bounds are clamped to [0, M]. See docs/grouped.md.
    """
    runtime.refuse_grad("grouped_gemm", GROUPED_NAMES, (a, b, a_scale, b_scale))  # traced as a guard when compiling
    if torch.compiler.is_compiling():
        if out is not None:
            _ops.grouped_gemm_out(a, b, a_scale, b_scale, offs, m_indices, out, backend or "")
            return out
        return _ops.grouped_gemm(a, b, a_scale, b_scale, offs, m_indices, out_dtype or torch.bfloat16, backend or "")
    name, rows = pick_row_map(offs, m_indices)
    return run_grouped(backend, ROW_MAP_LAYOUTS[name], a, b, a_scale, b_scale, rows, out, out_dtype, eager=True)


def grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, *, expected_m: int | None = None, out=None, out_dtype=None,
                        backend: str | None = None) -> torch.Tensor:  # fmt: skip
    """One GEMM per expert on a padded batch: ``out[g, r] = a[g, r] @ b[g].T`` for ``r < masked_m[g]``.

    a: FP8 [G, M_max, K]; a_scale: fp32 [G, M_max, K/128]; ``quantize_activation(x)`` of x [G, M_max, K] returns
    [G * M_max, K] and [G * M_max, K/128]: ``.view(G, M_max, -1)`` of each is what this takes (no copy).
    b, b_scale as for :func:`grouped_gemm`. masked_m: int32 [G] rows per group on a's device; rows
    ``>= masked_m[g]`` are neither computed nor written (``out=`` keeps them, the functional call returns zeros).
    expected_m: a hint of the typical ``masked_m`` for a kernel's choice of tiles; never a bound.

    No host synchronisation anywhere on this path, so decode steps run under CUDA graphs: ``masked_m`` on a GPU is
    never read by the host (kernels clamp it to [0, M_max]); on the CPU its values are checked (<= M_max).
    """
    runtime.refuse_grad("grouped_gemm_masked", GROUPED_NAMES, (a, b, a_scale, b_scale))
    hint = check_expected_m(expected_m)
    if torch.compiler.is_compiling():
        if out is not None:
            _ops.grouped_gemm_masked_out(a, b, a_scale, b_scale, masked_m, hint, out, backend or "")
            return out
        return _ops.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, hint, out_dtype or torch.bfloat16,
                                        backend or "")  # fmt: skip
    return run_grouped(backend, GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, out, out_dtype, hint)
