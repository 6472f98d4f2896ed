"""fp8gemm-cuda-sm120's weight-gradient kernels (csrc/wgrad_kernel.cuh, wgrad_launch and kgrouped_wgrad_launch) on
the GPU, against the float64 product of the same FP8 operands: both tiles (64 rows for M <= 64, else 128), M and N
tails, K block counts below and above the pipeline's stages, written into a NaN-poisoned out inside a NaN guard, added
into a non-zero out, accumulate into zeros bit for bit the plain product, bf16 output bit for bit the float32 one
rounded; bit for bit the forward kernel where the per-row B scales repeat a block's; the per-block accumulate;
fp8gemm.training.linear's dW over a padded last token block; the k-grouped kernel's 64-row tile and an out whose
experts start at odd element offsets (element-wise stores). tests/test_gpu_kgrouped_wgrad.py runs the k-grouped entry
of every backend that has it, sm120 included.

Skipped without a GPU or without fp8gemm-cuda-sm120 for it; on an H100/H200 its sm_90 test build (ci/gpu/run.sh
build) runs it:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_sm120_wgrad.py
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, count_calls, device_under_test
from fp8gemm import plans
from fp8gemm.reference import BLOCK
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import grouped_wgrad, kgrouped_wgrad, quantize_grouped_with_transpose
from kgrouped_float64 import kgrouped_float64
from test_gpu_wgrad import GUARD, _float64_product, _guard_intact, _guarded, _operands

pytestmark = [
    pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU"),
    pytest.mark.skipif("sm120" not in backends_under_test(), reason="fp8gemm-cuda-sm120 not installed for this GPU"),
]
FP32_TOLERANCE = 5e-4  # the contract's, for float32 output
BACKEND = "sm120"

# (M, N, K): what each reaches (heuristics.hpp wgrad_plan_for: 64-row tiles for M <= 64, else 128; 3 or 4 stages).
SHAPES = {
    (1, 16, 128): "one row, one column tile of 16, one K block",
    (64, 128, 256): "64-row tile, exact, fewer K blocks than the 4-stage prologue",
    (40, 272, 384): "64-row tile: M tail, N tail (16 columns of a last tile), 3 K blocks",
    (65, 400, 640): "128-row tile, one row in it; N tail",
    (128, 128, 256): "128-row tile, exact",
    (200, 272, 1152): "128-row tile: M and N tails, 9 K blocks",
    (384, 1024, 4096): "several tiles each way, 32 K blocks",
    (1000, 2176, 512): "many tiles, M tail",
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=lambda s: "x".join(map(str, s)))
def test_every_tile_against_float64(shape):
    m, n, k = shape
    a, b, a_scale, b_scale = _operands(7300 + m + k, m, n, k)
    plan = plans.checked_gemm_plan(a, b, a_scale, b_scale, None, torch.float32, BACKEND)
    assert type(plan) is plans.WgradPlan and plan.backend.name == BACKEND  # the kernel, not the reference
    want = _float64_product(a, b, a_scale, b_scale)
    whole, out = _guarded(m, n)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend=BACKEND)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and _guard_intact(whole, m, n)
    assert relative_error(out, want) < FP32_TOLERANCE, SHAPES[shape]

    start = torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7301)) * 100
    out.copy_(start)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True, backend=BACKEND)
    assert _guard_intact(whole, m, n)
    assert relative_error(out, start.double() + want) < FP32_TOLERANCE
    assert relative_error(out - start, want) < 2e-3  # the product itself: no tile added twice, none missing

    zeros = torch.zeros(m, n, device="cuda")
    fp8gemm.gemm(a, b, a_scale, b_scale, out=zeros, accumulate=True, backend=BACKEND)
    plain = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32, backend=BACKEND)
    assert torch.equal(zeros, plain)

    whole16 = torch.full((m + 2 * GUARD, n + GUARD), float("nan"), device="cuda", dtype=torch.bfloat16)
    out16 = whole16[GUARD : GUARD + m, :n]
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out16, backend=BACKEND)
    assert torch.equal(out16, plain.bfloat16()) and _guard_intact(whole16, m, n)


@pytest.mark.parametrize("m", [48, 200])
def test_bit_for_bit_the_forward_kernel_where_per_row_scales_repeat_a_block(m):
    """The same tile and MMA order, acc * (a_scale * b_scale) per 128 of K: with each column's scale its block's, the
    weight-gradient kernel's bits are the forward kernel's (K of 4 blocks: the forward is never split along K)."""
    n, k = 272, 512
    a, _, a_scale, _ = _operands(7400 + m, m, n, k)
    gen = torch.Generator(device="cuda").manual_seed(7401 + m)
    b, block_scale = fp8gemm.quantize_weight(
        torch.randn(n, k, device="cuda", generator=gen), fp8_dtype=torch.float8_e4m3fn
    )
    rows = block_scale.repeat_interleave(BLOCK, dim=0)[:n].contiguous()
    forward = fp8gemm.gemm(a, b, a_scale, block_scale, out_dtype=torch.float32, backend=BACKEND)
    wgrad = fp8gemm.gemm(a, b, a_scale, rows, out_dtype=torch.float32, backend=BACKEND)
    assert torch.equal(wgrad, forward)
    assert relative_error(wgrad, _float64_product(a, b, a_scale, rows)) < FP32_TOLERANCE


def test_accumulate_with_per_block_scales_runs_the_kernel():
    m, n, k = 200, 272, 1152
    a, _, a_scale, _ = _operands(7500, m, n, k)
    gen = torch.Generator(device="cuda").manual_seed(7501)
    b, block_scale = fp8gemm.quantize_weight(
        torch.randn(n, k, device="cuda", generator=gen), fp8_dtype=torch.float8_e4m3fn
    )
    plan = plans.checked_gemm_plan(a, b, a_scale, block_scale, None, torch.float32, BACKEND, accumulate=True)
    assert type(plan) is plans.WgradPlan
    start = torch.randn(m, n, device="cuda", generator=gen)
    out = start.clone()
    fp8gemm.gemm(a, b, a_scale, block_scale, out=out, accumulate=True, backend=BACKEND)
    rows = block_scale.repeat_interleave(BLOCK, dim=0)[:n]
    assert relative_error(out, start.double() + _float64_product(a, b, a_scale, rows)) < FP32_TOLERANCE


@pytest.mark.parametrize("tokens", [1000, 1024])
def test_training_weight_gradient_over_a_padded_last_token_block(tokens):
    """dW of fp8gemm.training.linear (the per-row form over M_pad tokens: 1000 -> 1024, x^T and dY^T zero-padded)
    within the contract of the float64 product of the same FP8 operands, and within 5% of float64 autograd."""
    seed = 7600 + tokens
    print(f"seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    weight = (torch.randn(768, 1024, device="cuda", generator=gen) * 0.03).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, 768, device="cuda", generator=gen, dtype=torch.bfloat16)
    fp8gemm.training.linear(x, weight, backend=BACKEND).backward(dy)
    xq = fp8gemm.training.quantize_with_transpose(x.detach(), backend=BACKEND)
    dq = fp8gemm.training.quantize_with_transpose(dy, backend=BACKEND)
    dw = fp8gemm.gemm(dq.q_t, xq.q_t, dq.scale_t, xq.scale_t, out_dtype=torch.float32, backend=BACKEND)
    assert relative_error(dw, _float64_product(dq.q_t, xq.q_t, dq.scale_t, xq.scale_t)) < FP32_TOLERANCE
    assert torch.equal(weight.grad, dw.to(torch.bfloat16))  # the layer's dW is that GEMM, cast to bf16
    assert relative_error(weight.grad, dy.double().t() @ x.detach().double()) < 0.05


# --- the k-grouped form ----------------------------------------------------------------------------------------------


def _grouped_operands(counts, n, k, rows_of_a, seed):
    """FP8 dY^T (its first rows_of_a rows) and X^T in the per-expert aligned layout, with their scales."""
    seed = DEFAULT_SEED + seed
    print(f"seed {seed}: {len(counts)} experts, {sum(counts)} tokens, N {rows_of_a}, K {k}")
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(counts)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    dy = (torch.randn(tokens, n, generator=gen) * (torch.rand(tokens, 1, generator=gen) * 4 + 0.1)).bfloat16().cuda()
    x = (torch.randn(tokens, k, generator=gen) * (torch.rand(tokens, 1, generator=gen) * 4 + 0.1)).bfloat16().cuda()
    a, b = quantize_grouped_with_transpose(dy, offs), quantize_grouped_with_transpose(x, offs)
    return offs, a.q_t[:rows_of_a], b.q_t, a.scale_t[:rows_of_a], b.scale_t


def _odd_expert_offsets(shape, dtype) -> torch.Tensor:
    """out [E, N, K] whose expert e starts e elements past E * N * K (rows 16-byte aligned), NaN-poisoned."""
    e, n, k = shape
    base = torch.full((e * (n * k + 1),), float("nan"), device="cuda", dtype=dtype)
    return base.as_strided(shape, (n * k + 1, k, 1))


@pytest.mark.parametrize("rows_of_a", [48, 64, 208])
def test_kgrouped_tiles_and_odd_expert_offsets(rows_of_a, monkeypatch):
    counts = [100, 0, 29, 300, 1]
    launches = count_calls(monkeypatch, grouped_wgrad, "_launch")
    offs, q_a, q_b, s_a, s_b = _grouped_operands(counts, 256, 384, rows_of_a, seed=rows_of_a)
    want = kgrouped_float64(q_a, q_b, s_a, s_b, counts)
    out = torch.full(want.shape, float("nan"), device="cuda")
    kgrouped_wgrad(q_a, q_b, s_a, s_b, offs, out=out, backend=BACKEND)
    assert launches[0] == 1
    for e, tokens in enumerate(counts):
        if tokens == 0:
            assert not out[e].any(), f"expert {e} has no token: its gradient must be zero"
        else:
            assert relative_error(out[e].double(), want[e]) < FP32_TOLERANCE, f"expert {e} ({tokens} tokens)"

    odd = _odd_expert_offsets(want.shape, torch.float32)
    kgrouped_wgrad(q_a, q_b, s_a, s_b, offs, out=odd, backend=BACKEND)
    assert torch.equal(odd, out)
    start = torch.randn(want.shape, generator=torch.Generator().manual_seed(DEFAULT_SEED + 77)).cuda()
    start[1, 0, 0] = -0.0  # an expert without tokens keeps its bits
    odd.copy_(start)
    kgrouped_wgrad(q_a, q_b, s_a, s_b, offs, out=odd, accumulate=True, backend=BACKEND)
    assert torch.equal(odd[[0, 2, 3, 4]], start[[0, 2, 3, 4]] + out[[0, 2, 3, 4]])
    assert torch.equal(odd[1].view(torch.int32), start[1].view(torch.int32))
    odd16 = _odd_expert_offsets(want.shape, torch.bfloat16)
    kgrouped_wgrad(q_a, q_b, s_a, s_b, offs, out=odd16, backend=BACKEND)
    assert torch.equal(odd16, out.bfloat16())
    assert launches[0] == 4
