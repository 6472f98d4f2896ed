"""Implementations ``fp8gemm bench`` times side by side with ours, each fed its preferred layout.

Every peer is ``prepare(a, b, a_scale, b_scale, out_dtype) -> run()``: layout conversion happens in
``prepare`` (outside the timed region), as a serving engine would do once for weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from fp8gemm.reference import expand_scales

Runner = Callable[[], torch.Tensor]
Prepare = Callable[..., Runner]


def _col_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def _scaled_mm_blockwise(a, b, a_scale, b_scale, out_dtype) -> Runner:
    """cuBLASLt's 1x128 x 128x128 blockwise FP8 path in torch (sm_90, CUDA >= 12.9)."""
    sa, sb = _col_major(a_scale), b_scale.t()  # a scale M-major; b scale as [K/128, N/128]
    return lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=out_dtype)


def _bf16_matmul(a, b, a_scale, b_scale, out_dtype) -> Runner:
    """The unquantised baseline: the same product in bf16 (cuBLAS), no scales."""
    sa, sb = expand_scales(a_scale, b_scale, b.shape[0])
    a16, b16 = (a.float() * sa).bfloat16(), (b.float() * sb).bfloat16()
    return lambda: (a16 @ b16.t()).to(out_dtype)


def deepgemm_mn_major(deep_gemm, scale: torch.Tensor) -> torch.Tensor:
    """``scale`` in the MN-major, TMA-aligned layout DeepGEMM reads on sm90 (converted once, not inside each call),
    where this release has the converter."""
    to_mn_major = getattr(deep_gemm, "get_mn_major_tma_aligned_tensor", None)
    return to_mn_major(scale) if to_mn_major else scale


def _deep_gemm(a, b, a_scale, b_scale, out_dtype) -> Runner:
    import deep_gemm  # optional; timed only where importable

    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
    # Its quantizers emit activation scales MN-major and TMA-aligned; convert once, as they would.
    sa = deepgemm_mn_major(deep_gemm, a_scale)

    def run():
        deep_gemm.fp8_gemm_nt((a, sa), (b, b_scale), out, disable_ue8m0_cast=True)
        return out

    return run


@functools.lru_cache(maxsize=1)
def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def block_fp8_gemm(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, lda, ldb, ldc, as_ld, bs_ld,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
        # One program per BLOCK_M x BLOCK_N tile, grouped for L2 reuse; BLOCK_K = 128 = scale block,
        # BLOCK_N <= 128 divides 128 so one tile column reads one b_scale row.
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        group = pid // (GROUP_M * grid_n)
        first_m = group * GROUP_M
        size_m = min(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
        pid_n = (pid % (GROUP_M * grid_n)) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, 128)
        a_ptrs = a_ptr + rm[:, None] * lda + rk[None, :]
        b_ptrs = b_ptr + rn[None, :] * ldb + rk[:, None]
        m_ok, n_ok = rm < M, rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, K // 128):
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
            sa = tl.load(as_ptr + rm * as_ld + kb, mask=m_ok, other=0.0)
            sb = tl.load(bs_ptr + (pid_n * BLOCK_N // 128) * bs_ld + kb)
            acc += tl.dot(a, b) * sa[:, None] * sb
            a_ptrs += 128
            b_ptrs += 128
        c = acc.to(c_ptr.dtype.element_ty)
        tl.store(c_ptr + rm[:, None] * ldc + rn[None, :], c, mask=m_ok[:, None] & n_ok[None, :])

    return block_fp8_gemm


def _triton_block_fp8(a, b, a_scale, b_scale, out_dtype) -> Runner:
    """A Triton block-FP8 kernel of the kind vLLM and SGLang ship (w8a8 block matmul)."""
    kernel = _triton_kernel()
    m, k = a.shape
    n = b.shape[0]
    sa, sb = a_scale.contiguous(), b_scale.contiguous()
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    block_m = 64 if m <= 64 else 128
    block_n = 128
    warps, stages = (4, 4) if block_m == 64 else (8, 3)
    grid = (-(-m // block_m) * -(-n // block_n),)

    def run():
        kernel[grid](a, b, out, sa, sb, m, n, k, a.stride(0), b.stride(0), out.stride(0), sa.stride(0),
                     sb.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, num_warps=warps,
                     num_stages=stages)  # fmt: skip
        return out

    return run


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except Exception:
        return False
    return True


def available_peers(device: torch.device) -> dict[str, Prepare]:
    """Peers that can run on ``device`` in this environment: GPU libraries only, none on CPU."""
    if device.type != "cuda":
        return {}
    peers: dict[str, Prepare] = {"torch._scaled_mm blockwise": _scaled_mm_blockwise}
    if _importable("triton"):
        peers["triton block-fp8"] = _triton_block_fp8
    if _importable("deep_gemm"):
        peers["DeepGEMM"] = _deep_gemm
    peers["bf16 matmul"] = _bf16_matmul
    return peers
