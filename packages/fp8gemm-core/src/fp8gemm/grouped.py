"""``fp8gemm.grouped_gemm`` and ``fp8gemm.grouped_gemm_masked``: one GEMM per expert of a mixture of experts, in one
call, planned once (``grouped_checks.plan_grouped``) and run by ``launch.run_grouped``; and the torch.library ops for
torch.compile and CUDA graphs (docs/grouped.md)."""

from __future__ import annotations

import torch

from . import runtime
from .autograd import refuse_grad
from .grouped_checks import (
    GROUPED_NAMES,
    GroupedShape,
    check_expected_m,
    check_grouped,
    launch_plan,
    pick_row_map,
    plan_grouped,
)
from .launch import run_grouped
from .native import reraise_unless_miss
from .protocol import GROUPED_MASKED
from .runtime import LIBRARY


def run_checked_grouped(backend, layout: int, shape: GroupedShape, a, b, a_scale, b_scale, group_rows, out,
                        expected_m: int = 0) -> None:  # fmt: skip
    """Operands of M > 0 rows that the caller checked (``fused_experts``) to ``backend``'s grouped kernel on a's
    device where it has ``layout``, else to the grouped reference."""
    plan = launch_plan(backend, layout, shape, tuple(out.shape), out.dtype, a, a_scale, b_scale)
    run_grouped(plan, a, b, group_rows, out, expected_m)


def native_or_none(native, name: str, args: tuple, out, out_dtype):
    """``native.<name>(*args, fp32_out)``, or ``native.<name>_out(*args, out)`` with ``out``: one C++ call; None
    where there is no native op or it declines the call (the planner then takes it)."""
    if native is None or (out is not None and out_dtype is not None):
        return None
    if out is None and out_dtype not in (None, torch.bfloat16, torch.float32):
        return None
    try:
        if out is None:
            return getattr(native, name)(*args, out_dtype is torch.float32)
        getattr(native, name + "_out")(*args, out)
        return out
    except RuntimeError as error:
        reraise_unless_miss(error)
    return None


def native_grouped(a, b, a_scale, b_scale, offs, m_indices, out, out_dtype, backend, eager: bool):
    """``grouped_gemm`` through the native op: with ``offs`` (an eager call outside CUDA-graph capture reads offs on
    the host first, as the planner does) or with ``m_indices`` (read by the device alone, as the planner leaves them
    on a GPU); None where it declines, or for both or neither (the planner's error)."""
    if (offs is None) == (m_indices is None):
        return None
    native = runtime.native_ops(a, b, backend)
    if m_indices is not None:
        return native_or_none(native, "grouped_gemm_row_ids", (a, b, a_scale, b_scale, m_indices), out, out_dtype)
    check_offs = native is not None and eager and not runtime.capturing()
    return native_or_none(native, "grouped_gemm", (a, b, a_scale, b_scale, offs, check_offs), out, out_dtype)


# --- torch.library ops: what torch.compile and graph capture see -------------------------------------------------


@runtime.op("grouped_gemm", "grouped_gemm", GROUPED_NAMES)
def _grouped_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                offs: torch.Tensor | None, m_indices: torch.Tensor | None, out_dtype: torch.dtype,
                backend: str) -> torch.Tensor:  # fmt: skip
    got = native_grouped(a, b, a_scale, b_scale, offs, m_indices, None, out_dtype, backend, eager=False)
    if got is not None:
        return got
    layout, rows = pick_row_map(offs, m_indices)
    plan = plan_grouped(layout, a, b, a_scale, b_scale, rows, None, out_dtype, backend, eager=False)
    return run_grouped(plan, a, b, rows, None)


@_grouped_op.register_fake
def _(a, b, a_scale, b_scale, offs, m_indices, out_dtype, backend):
    layout, rows = pick_row_map(offs, m_indices)
    _, out_shape, dtype = check_grouped(layout, a, b, a_scale, b_scale, rows, None, out_dtype, None)
    return a.new_empty(out_shape, dtype=dtype)


@runtime.op("grouped_gemm_out", "grouped_gemm", GROUPED_NAMES, mutates_args=("out",))
def _grouped_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                    offs: torch.Tensor | None, m_indices: torch.Tensor | None, out: torch.Tensor,
                    backend: str) -> None:  # fmt: skip
    if native_grouped(a, b, a_scale, b_scale, offs, m_indices, out, None, backend, eager=False) is not None:
        return
    layout, rows = pick_row_map(offs, m_indices)
    run_grouped(plan_grouped(layout, a, b, a_scale, b_scale, rows, out, None, backend, eager=False), a, b, rows, out)


@_grouped_out_op.register_fake
def _(a, b, a_scale, b_scale, offs, m_indices, out, backend):
    layout, rows = pick_row_map(offs, m_indices)
    check_grouped(layout, a, b, a_scale, b_scale, rows, out, None, None)


@runtime.op("grouped_gemm_masked", "grouped_gemm_masked", GROUPED_NAMES)
def _masked_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
               masked_m: torch.Tensor, expected_m: int, out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    plan = plan_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, None, out_dtype, backend, eager=False)
    return run_grouped(plan, a, b, masked_m, None, expected_m)


@_masked_op.register_fake
def _(a, b, a_scale, b_scale, masked_m, expected_m, out_dtype, backend):
    _, out_shape, dtype = check_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, None, out_dtype, None)
    return a.new_empty(out_shape, dtype=dtype)


@runtime.op("grouped_gemm_masked_out", "grouped_gemm_masked", GROUPED_NAMES, mutates_args=("out",))
def _masked_out_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                   masked_m: torch.Tensor, expected_m: int, out: torch.Tensor, backend: str) -> None:  # fmt: skip
    plan = plan_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, out, None, backend, eager=False)
    run_grouped(plan, a, b, masked_m, out, expected_m)


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
    refuse_grad("grouped_gemm", GROUPED_NAMES, (a, b, a_scale, b_scale))  # traced as a guard when compiling
    if torch.compiler.is_compiling():
        if out is not None:
            _ops.grouped_gemm_out(a, b, a_scale, b_scale, offs, m_indices, out, backend or "")
            return out
        return _ops.grouped_gemm(a, b, a_scale, b_scale, offs, m_indices, out_dtype or torch.bfloat16, backend or "")
    got = native_grouped(a, b, a_scale, b_scale, offs, m_indices, out, out_dtype, backend, eager=True)
    if got is not None:  # one C++ call where the backend's native op takes it, else the planner
        return got
    layout, rows = pick_row_map(offs, m_indices)
    plan = plan_grouped(layout, a, b, a_scale, b_scale, rows, out, out_dtype, backend, eager=True)
    return run_grouped(plan, a, b, rows, out)


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
    refuse_grad("grouped_gemm_masked", GROUPED_NAMES, (a, b, a_scale, b_scale))
    hint = check_expected_m(expected_m)
    if torch.compiler.is_compiling():
        if out is not None:
            _ops.grouped_gemm_masked_out(a, b, a_scale, b_scale, masked_m, hint, out, backend or "")
            return out
        return _ops.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, hint, out_dtype or torch.bfloat16,
                                        backend or "")  # fmt: skip
    native = runtime.native_ops(a, b, backend)  # one C++ call where the backend's native op takes it
    got = native_or_none(native, "grouped_gemm_masked", (a, b, a_scale, b_scale, masked_m, hint), out, out_dtype)
    if got is not None:
        return got
    plan = plan_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, out, out_dtype, backend, eager=False)
    return run_grouped(plan, a, b, masked_m, out, hint)
