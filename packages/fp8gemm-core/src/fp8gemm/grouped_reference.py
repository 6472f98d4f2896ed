"""The pure-torch grouped GEMM: what every grouped kernel must match, run wherever no backend has one.

It never reads ``offs``, ``m_indices`` or ``masked_m`` on the host: the rows of a group are a mask computed on the
tensors' device, so the reference is as free of synchronisation as a kernel, and CUDA graphs capture it. Group
bounds are clamped to the rows that exist, so no value reaches outside the tensors; a row outside every group keeps
what ``out`` held.
"""

from __future__ import annotations

import torch

from .protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS
from .reference import expand_scales


def _product(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """One group's [rows, N] fp32 product, dequantised first as :func:`reference.reference_gemm` does."""
    sa, sb = expand_scales(a_scale.float(), b_scale.float(), b.shape[0])
    return (a.to(torch.float32) * sa) @ (b.to(torch.float32) * sb).t()


def _group_bounds(offs: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's [start, end) rows from cumulative ends, as the kernels read them on the device: each end clamped
    to [previous end, m] (a running maximum), so groups never overlap whatever values arrive."""
    ends = torch.cummax(offs.to(torch.int64).clamp(0, m), dim=0).values
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    return starts, ends


def reference_grouped(layout: int, a, b, a_scale, b_scale, group_rows: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` <- each group's rows of ``a`` times its ``b``; rows in no group are left as they are.

    ``layout`` is a ``protocol.GROUPED_*`` value and ``group_rows`` the offs / masked_m / m_indices it names.
    """
    groups = b.shape[0]
    if layout == GROUPED_MASKED:
        m_max = a.shape[1]
        rows = torch.arange(m_max, device=a.device)
        counts = group_rows.to(torch.int64).clamp(0, m_max)
        for g in range(groups):
            written = (rows < counts[g])[:, None]
            out[g].copy_(torch.where(written, _product(a[g], a_scale[g], b[g], b_scale[g]).to(out.dtype), out[g]))
        return
    m = a.shape[0]
    rows = torch.arange(m, device=a.device)
    if layout == GROUPED_CONTIGUOUS:
        starts, ends = _group_bounds(group_rows, m)
    elif layout != GROUPED_ROW_IDS:
        raise ValueError(f"unknown grouped layout {layout}")
    result = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    covered = torch.zeros(m, 1, dtype=torch.bool, device=out.device)
    for g in range(groups):
        if layout == GROUPED_CONTIGUOUS:
            in_group = ((rows >= starts[g]) & (rows < ends[g]))[:, None]
        else:
            in_group = (group_rows == g)[:, None]
        result = torch.where(in_group, _product(a, a_scale, b[g], b_scale[g]), result)
        covered |= in_group
    out.copy_(torch.where(covered, result.to(out.dtype), out))
