"""fp8gemm-cuda-sm90a's weight-gradient entry (csrc/wgrad_launch.cuh, GemmType::kWgrad) on the GPU, against the float64
product of the same FP8 operands: every compiled kernel (sm90a_kernel_shapes.py WGRAD_KERNEL_SHAPES: M and N tails,
K block counts below and above the unrolled loop's, an odd N block count for the 256-row pairs), written into a
NaN-poisoned out inside a NaN guard, added into a non-zero out (the rows a short last M block recomputes must not be
added twice), accumulate into zeros bit for bit equal to the plain product, bf16 output bit for bit the float32 one
rounded, the per-block accumulate, and
fp8gemm.training.linear's dW over a token count that is not a multiple of 128 (the quantizer's zero-padded last block).

Skipped without a GPU or without fp8gemm-cuda-sm90a; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_wgrad.py
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test
from fp8gemm import plans
from fp8gemm.reference import BLOCK
from fp8gemm.testing.conformance import relative_error
from sm90a_kernel_shapes import WGRAD_KERNEL_SHAPES

pytestmark = [
    pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU"),
    pytest.mark.skipif("sm90a" not in backends_under_test(), reason="fp8gemm-cuda-sm90a not installed or not this GPU"),
]
FP32_TOLERANCE = 5e-4  # the contract's, for float32 output
GUARD = 16  # NaN rows above and below out, NaN columns past N


def _float64_product(a, b, a_scale, b_scale) -> torch.Tensor:
    """Each FP8 element dequantised with its own 1x128 scale, then one float64 matmul (on the GPU)."""
    sa = a_scale.double().repeat_interleave(BLOCK, dim=1)
    sb = b_scale.double().repeat_interleave(BLOCK, dim=1)
    return (a.double() * sa) @ (b.double() * sb).t()


def _operands(seed: int, m: int, n: int, k: int):
    """a [m, k], b [n, k] FP8 with 1x128 scales along K (b's per row, row magnitudes differing), row-major scales: the
    core conforms them to the backend's MN-major layouts."""
    print(f"seed {seed}: m {m}, n {n}, k {k}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, a_scale = fp8gemm.quantize_activation(torch.randn(m, k, device="cuda", generator=gen) * 3, backend="reference")
    rows = torch.randn(n, k, device="cuda", generator=gen) * torch.rand(n, 1, device="cuda", generator=gen).add(0.05)
    b, b_scale = fp8gemm.quantize_activation(rows, backend="reference")
    return a, b, a_scale, b_scale


def _guarded(m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    whole = torch.full((m + 2 * GUARD, n + GUARD), float("nan"), device="cuda")
    return whole, whole[GUARD : GUARD + m, :n]


def _guard_intact(whole: torch.Tensor, m: int, n: int) -> bool:
    inside = torch.zeros_like(whole, dtype=torch.bool)
    inside[GUARD : GUARD + m, :n] = True
    return bool(torch.isnan(whole[~inside]).all())


@pytest.mark.parametrize("shape", list(WGRAD_KERNEL_SHAPES), ids=lambda s: "x".join(map(str, s)))
def test_every_wgrad_kernel_against_float64(shape):
    m, n, k = shape
    a, b, a_scale, b_scale = _operands(7000 + m + k, m, n, k)
    plan = plans.checked_gemm_plan(a, b, a_scale, b_scale, None, torch.float32, "sm90a")
    assert type(plan) is plans.WgradPlan  # the per-row form reaches the kernel, not the reference
    want = _float64_product(a, b, a_scale, b_scale)
    whole, out = _guarded(m, n)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend="sm90a")
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and _guard_intact(whole, m, n)
    assert relative_error(out, want) < FP32_TOLERANCE, WGRAD_KERNEL_SHAPES[shape]

    start = torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7001)) * 100
    out.copy_(start)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True, backend="sm90a")
    assert _guard_intact(whole, m, n)
    assert relative_error(out, start.double() + want) < FP32_TOLERANCE
    assert relative_error(out - start, want) < 2e-3  # the product itself: no row added twice, none missing

    zeros = torch.zeros(m, n, device="cuda")
    fp8gemm.gemm(a, b, a_scale, b_scale, out=zeros, accumulate=True, backend="sm90a")
    plain = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32, backend="sm90a")
    assert torch.equal(zeros, plain)

    # bf16 out (a bf16 weight's gradient): the float32 product rounded once, into a guarded, NaN-poisoned buffer
    whole16 = torch.full((m + 2 * GUARD, n + GUARD), float("nan"), device="cuda", dtype=torch.bfloat16)
    out16 = whole16[GUARD : GUARD + m, :n]
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out16, backend="sm90a")
    assert torch.equal(out16, plain.bfloat16()) and _guard_intact(whole16, m, n)


def test_accumulate_with_per_block_scales_runs_the_kernel():
    m, n, k = 200, 272, 1152
    a, _, a_scale, _ = _operands(7100, m, n, k)
    gen = torch.Generator(device="cuda").manual_seed(7101)
    b, block_scale = fp8gemm.quantize_weight(
        torch.randn(n, k, device="cuda", generator=gen), fp8_dtype=torch.float8_e4m3fn
    )
    plan = plans.checked_gemm_plan(a, b, a_scale, block_scale, None, torch.float32, "sm90a", accumulate=True)
    assert type(plan) is plans.WgradPlan
    start = torch.randn(m, n, device="cuda", generator=gen)
    out = start.clone()
    fp8gemm.gemm(a, b, a_scale, block_scale, out=out, accumulate=True, backend="sm90a")
    rows = block_scale.repeat_interleave(BLOCK, dim=0)[:n]
    assert relative_error(out, start.double() + _float64_product(a, b, a_scale, rows)) < FP32_TOLERANCE


@pytest.mark.parametrize("tokens", [1000, 1024])
def test_training_weight_gradient_over_a_padded_last_token_block(tokens):
    """dW of fp8gemm.training.linear (the per-row form over M_pad tokens: 1000 -> 1024, x^T and dY^T zero-padded)
    within the contract of the float64 product of the same FP8 operands, and within 5% of float64 autograd."""
    seed = 7200 + tokens
    print(f"seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    weight = (torch.randn(768, 1024, device="cuda", generator=gen) * 0.03).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, 768, device="cuda", generator=gen, dtype=torch.bfloat16)
    fp8gemm.training.linear(x, weight, backend="sm90a").backward(dy)
    xq = fp8gemm.training.quantize_with_transpose(x.detach(), backend="sm90a")
    dq = fp8gemm.training.quantize_with_transpose(dy, backend="sm90a")
    assert xq.q_t.shape == (1024, 1024)
    dw = fp8gemm.gemm(dq.q_t, xq.q_t, dq.scale_t, xq.scale_t, out_dtype=torch.float32, backend="sm90a")
    want = _float64_product(dq.q_t, xq.q_t, dq.scale_t, xq.scale_t)
    assert relative_error(dw, want) < FP32_TOLERANCE
    assert torch.equal(weight.grad, dw.to(torch.bfloat16))  # the layer's dW is that GEMM, cast to bf16
    assert relative_error(weight.grad, dy.double().t() @ x.detach().double()) < 0.05
