"""The pure-torch implementation of the contract: runs on CPU and on any GPU torch supports.

It is the fallback for CPU tensors and, with :func:`oracle`, the yardstick the conformance suite
holds every backend to.
"""

from __future__ import annotations

import dataclasses

import torch

BLOCK = 128
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


@dataclasses.dataclass(frozen=True)
class ReferenceBackend:
    name: str = "reference"
    platform: str = "any"
    targets: tuple[str, ...] = ("cpu", "any torch device")
    fp8_dtype: str | None = None  # accepts both e4m3fn and e4m3fnuz
    version: str = ""
    package: str = "fp8gemm-core"

    @property
    def build_info(self) -> dict[str, str]:
        return {"implementation": "pure torch, fp32 dequantise + fp32 matmul", "torch": torch.__version__}


REFERENCE = ReferenceBackend()


def expand_scales(a_scale: torch.Tensor, b_scale: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element scales: a_scale [M, K/128] -> [M, K]; b_scale [N/128, K/128] -> [N, K]."""
    sa = a_scale.repeat_interleave(BLOCK, dim=1)
    sb = b_scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)
    return sa, sb


def reference_gemm(a, b, a_scale, b_scale, out: torch.Tensor) -> torch.Tensor:
    """out <- (a * a_scale) @ (b * b_scale)^T, dequantised to fp32 and multiplied in fp32."""
    sa, sb = expand_scales(a_scale.float(), b_scale.float(), b.shape[0])
    a32 = a.to(torch.float32) * sa
    b32 = b.to(torch.float32) * sb
    out.copy_(a32 @ b32.t())
    return out


def oracle(a, b, a_scale, b_scale) -> torch.Tensor:
    """float64 on the inputs' device, written as the contract's sum over 128-wide K blocks.

    Deliberately not the dequantise-first formula of :func:`reference_gemm`.
    """
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    sa, sb = a_scale.to(torch.float64), b_scale.to(torch.float64)
    m, k = a64.shape
    n = b64.shape[0]
    sb_rows = sb.repeat_interleave(BLOCK, dim=0)[:n]  # [N, K/128]
    acc = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    for kb in range(k // BLOCK):
        ks = slice(kb * BLOCK, (kb + 1) * BLOCK)
        acc += (a64[:, ks] @ b64[:, ks].t()) * sa[:, kb, None] * sb_rows[None, :, kb]
    return acc
