"""Adapters from other projects' operand layouts to the fp8gemm contract."""

from __future__ import annotations

import torch


def from_kxm_layout(a_km: torch.Tensor, b_kn: torch.Tensor, a_scale_km: torch.Tensor, b_scale_kn: torch.Tensor):
    """RadeonFlow / Hugging Face kernel-hub layout -> ours.

    There, ``a`` is [K, M], ``b`` is [K, N], ``a_scale`` is [K/128, M] and ``b_scale`` is
    [K/128, N/128]. Returns ``(a [M, K], b [N, K], a_scale [M, K/128], b_scale [N/128, K/128])``.
    The operands are copied once into K-contiguous form (transpose + contiguous); the scales are
    returned as transposed views, which the core accepts (column-major is converted as needed).
    """
    for name, t in (("a_km", a_km), ("b_kn", b_kn), ("a_scale_km", a_scale_km), ("b_scale_kn", b_scale_kn)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor")
    if a_km.shape[0] != b_kn.shape[0]:
        raise ValueError(f"a_km is [K, M] = {tuple(a_km.shape)} and b_kn is [K, N] = {tuple(b_kn.shape)}: K differs")
    return a_km.t().contiguous(), b_kn.t().contiguous(), a_scale_km.t(), b_scale_kn.t()
