"""The pure-torch implementation of the contract: runs on CPU and on any GPU torch supports.

It is the fallback for CPU tensors and, with :func:`oracle`, the yardstick the conformance suite
holds every backend to. :func:`reference_quantize` defines the activation quantization every kernel
matches bit for bit (numerics, tie and NaN rules: docs/quantization.md).
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

# The smallest normal fp32: the scale floor. Tiny blocks keep their relative precision down to
# amax = fp8_max * 2^-126, and an all-zero block gets a finite scale.
SCALE_FLOOR = torch.finfo(torch.float32).tiny


def round_up_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Each finite positive scale rounded up to a power of two, by its bits (exact, as the kernels do)."""
    bits = scale.view(torch.int32)
    exponent = bits & 0x7F800000
    up = (bits & ~0x7FFFFF) + 0x800000
    return torch.where((exponent != 0x7F800000) & ((bits & 0x7FFFFF) != 0), up, bits).view(torch.float32)


def scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool) -> torch.Tensor:
    """``max(amax / fp8_max, SCALE_FLOOR)``, NaN kept; ``pow2``: UE8M0 scales (DeepSeek-V3.1 recipe)."""
    amax = amax.float()
    scale = amax / torch.full_like(amax, fp8_max)  # a true division: torch turns "/ scalar" into a multiply on GPUs
    scale = torch.where(scale < SCALE_FLOOR, SCALE_FLOOR, scale)
    return round_up_pow2(scale) if pow2 else scale


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(scale) / scale  # correctly rounded on every device, as the kernels' 1.0f / scale


def reference_quantize(x2d: torch.Tensor, fp8_dtype: torch.dtype, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float -> (FP8 [M, K], fp32 [M, K/128] row-major): the definition every kernel matches."""
    fp8_max = torch.finfo(fp8_dtype).max
    m, k = x2d.shape
    groups = x2d.float().contiguous().reshape(m, k // BLOCK, BLOCK)
    scale = scale_from_amax(groups.abs().amax(dim=-1), fp8_max, pow2)
    q = (groups * reciprocal(scale)[..., None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(m, k), scale


def b_scale_rows(b_scale: torch.Tensor, n: int) -> torch.Tensor:
    """b_scale as one row per row of b: [N, K/128] as given (the per-row, "1D1D" form), or each 128x128 block's row
    repeated. With N == 1 both forms are [1, K/128] and mean the same numbers."""
    return b_scale if b_scale.shape[0] == n else b_scale.repeat_interleave(BLOCK, dim=0)[:n]


def expand_scales(a_scale: torch.Tensor, b_scale: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element scales: a_scale [M, K/128] -> [M, K]; b_scale [ceil(N/128), K/128] or [N, K/128] -> [N, K]."""
    sa = a_scale.repeat_interleave(BLOCK, dim=1)
    sb = b_scale_rows(b_scale, n).repeat_interleave(BLOCK, dim=1)
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
    sb_rows = b_scale_rows(sb, n)  # [N, K/128]
    acc = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    for kb in range(k // BLOCK):
        ks = slice(kb * BLOCK, (kb + 1) * BLOCK)
        acc += (a64[:, ks] @ b64[:, ks].t()) * sa[:, kb, None] * sb_rows[None, :, kb]
    return acc
