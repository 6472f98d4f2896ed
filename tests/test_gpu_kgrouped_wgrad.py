"""The k-grouped weight-gradient GEMM of the CUDA arch packages (``kgrouped_wgrad_launch``: every expert's dW_e =
dY_e^T X_e in one launch on the per-expert aligned layout) on the GPU: every expert against float64 of the same FP8
operands, within the weight-gradient contract, on expert counts with empty, partial and many experts and on sizes
that reach each compiled tile; bf16 output; accumulation leaving empty experts' bits untouched; poisoned outputs;
repeatable bits; offs the host never checks, clamped as the reference clamps them; more experts than the kernel takes
going to the reference.

Skipped without a GPU or without a backend that has the entry; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_kgrouped_wgrad.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import count_calls, device_under_test, gpu_backends_with
from fp8gemm import registry
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import grouped_wgrad, kgrouped_wgrad, quantize_grouped_with_transpose
from kgrouped_float64 import kgrouped_float64
from sm90a_kernel_shapes import KGROUPED_WGRAD_KERNEL_SHAPES

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")

# The weight-gradient contract against float64 of the same FP8 operands (docs/training.md): fp32 and bf16 output.
FP32_TOLERANCE, BF16_TOLERANCE = 5e-4, 4e-3


BACKENDS = gpu_backends_with("kgrouped_wgrad_launch")


@pytest.fixture
def launches(monkeypatch):
    """How many times the kernel entry was called, so a reference fallback cannot pass as the kernel."""
    return count_calls(monkeypatch, grouped_wgrad, "_launch")


def _operands(counts, n, k, seed):
    """FP8 dY^T and X^T of sorted rows with ``counts`` tokens per expert (printed seed, rows at different scales)."""
    seed = DEFAULT_SEED + seed
    print(f"seed {seed}: {len(counts)} experts, {sum(counts)} tokens, N {n}, K {k}")
    gen = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    dy = (torch.randn(rows, n, generator=gen) * (torch.rand(rows, 1, generator=gen) * 4 + 0.1)).bfloat16().cuda()
    x = (torch.randn(rows, k, generator=gen) * (torch.rand(rows, 1, generator=gen) * 4 + 0.1)).bfloat16().cuda()
    return offs, quantize_grouped_with_transpose(dy, offs), quantize_grouped_with_transpose(x, offs)


def _poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _check_experts(got, want, counts, tolerance) -> None:
    for e, n in enumerate(counts):
        if n == 0:
            assert not got[e].any(), f"expert {e} has no token: its gradient must be zero"
        else:
            err = relative_error(got[e].double(), want[e])
            assert err < tolerance, f"expert {e} ({n} tokens): {err:.2e} from float64"


# (counts, N, K): empty and partial experts, one expert holding everything, many experts, one tile a product and
# many; the sizes that reach each compiled tile are KGROUPED_WGRAD_KERNEL_SHAPES (below). N and K are the quantized
# rows' widths: multiples of 128.
CASES = [
    ([1, 127, 128, 129, 300], 128, 256),
    ([129, 0, 0, 127, 1, 0, 300], 128, 128),
    ([0, 700, 0], 384, 256),
    ([0, 0], 128, 128),
    ([(e * 37) % 300 for e in range(40)], 1024, 2176),
    ([512] * 6 + [0, 1, 1300], 1536, 2176),
    ([3 * (e % 5) for e in range(300)], 128, 128),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{len(c[0])}-T{sum(c[0])}-{c[1]}x{c[2]}")
def test_every_expert_against_float64_of_the_same_fp8_operands(backend, case, launches):
    counts, n, k = case
    offs, a, b = _operands(counts, n, k, seed=len(counts) + n)
    want = kgrouped_float64(a.q_t, b.q_t, a.scale_t, b.scale_t, counts)
    out = _poisoned(want.shape)
    kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=out, backend=backend)
    assert launches[0] == 1
    _check_experts(out, want, counts, FP32_TOLERANCE)
    again = kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, backend=backend)
    assert torch.equal(again.view(torch.int32), out.view(torch.int32)), "the bits differ between two runs"
    bf16 = _poisoned(want.shape, torch.bfloat16)
    kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=bf16, backend=backend)
    assert torch.equal(bf16, out.bfloat16())  # the fp32 sum rounded once
    _check_experts(bf16, want, counts, BF16_TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("experts", [1, 5])
@pytest.mark.parametrize("m", [48, 80, 208])  # a warpgroup without rows, a store box past M, a last block started early
def test_bf16_out_of_rows_that_end_inside_a_tile(backend, m, experts, launches):
    """bf16 out with few tokens per expert (the plan's TMA-store tile) on output rows that are not a multiple of the
    tile's: the fp32 result rounded, bit for bit, and within the contract of float64."""
    counts = [200, 3, 0, 130, 77][:experts]
    offs, a, b = _operands(counts, 256, 256, seed=50 + m + experts)
    a_t, a_scale_t = a.q_t[:m], a.scale_t[:m]
    want = kgrouped_float64(a_t, b.q_t, a_scale_t, b.scale_t, counts)
    fp32 = kgrouped_wgrad(a_t, b.q_t, a_scale_t, b.scale_t, offs, backend=backend)
    bf16 = _poisoned(want.shape, torch.bfloat16)
    kgrouped_wgrad(a_t, b.q_t, a_scale_t, b.scale_t, offs, out=bf16, backend=backend)
    assert launches[0] == 2
    assert torch.equal(bf16, fp32.bfloat16())
    _check_experts(bf16, want, counts, BF16_TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case", KGROUPED_WGRAD_KERNEL_SHAPES, ids=lambda c: f"{'-'.join(map(str, c[0]))}-{c[1]}x{c[2]}-{c[3]}"
)
def test_every_kgrouped_kernel_in_each_out_mode(backend, case, launches):
    """The sizes on which sm90a's plan takes each k-grouped tile (tests/sm90a_kernel_shapes.py; other backends run
    them as they plan them): fp32, bf16 (the fp32 sum rounded) or accumulated out, against float64."""
    counts, n, k, out_mode = case
    offs, a, b = _operands(list(counts), n, k, seed=sum(counts) + n + k)
    want = kgrouped_float64(a.q_t, b.q_t, a.scale_t, b.scale_t, counts)
    if out_mode == "accumulate":
        start = torch.randn(want.shape, generator=torch.Generator().manual_seed(DEFAULT_SEED + n)).cuda()
        out = start.clone()
        kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=out, accumulate=True, backend=backend)
        got = out - start
        empty = [e for e, c in enumerate(counts) if c == 0]
        assert torch.equal(out[empty], start[empty]), "an expert with no token changed its main gradient"
    else:
        got = _poisoned(want.shape, torch.bfloat16 if out_mode == "bf16" else torch.float32)
        kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=got, backend=backend)
    assert launches[0] == 1
    _check_experts(got, want, counts, BF16_TOLERANCE if out_mode == "bf16" else FP32_TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulate_adds_and_leaves_empty_experts_bits_untouched(backend, launches):
    counts = [200, 0, 57, 0, 1000]
    offs, a, b = _operands(counts, 256, 384, seed=9)
    gen = torch.Generator().manual_seed(DEFAULT_SEED + 10)
    start = torch.randn(len(counts), 256, 384, generator=gen).cuda()
    start[1, 0, 0] = -0.0  # untouched means its bits too: -0.0 + 0.0 would be +0.0
    product = kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, backend=backend)
    out = start.clone()
    kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=out, accumulate=True, backend=backend)
    assert launches[0] == 2
    assert torch.equal(out[[0, 2, 4]], start[[0, 2, 4]] + product[[0, 2, 4]])
    assert torch.equal(out[[1, 3]].view(torch.int32), start[[1, 3]].view(torch.int32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ends", [[300, 100, 200], [-5, 50, 10_000], [2**31 - 1, -(2**31), 7]], ids=str)
def test_unchecked_offs_are_clamped_as_the_reference_clamps_them(backend, ends):
    """offs straight to the entry (the host checks nothing on this path): ends out of order, negative and past the
    layout's bound read nothing outside the operands and give the reference's clamped experts."""
    _, a, b = _operands([260], 128, 256, seed=31)
    offs = torch.tensor(ends, dtype=torch.int32, device="cuda")
    q_a = torch.cat([a.q_t, torch.zeros_like(a.q_t[:, :256])], 1)  # two more gap blocks: E + M // 128 + 1 for E = 3
    q_b = torch.cat([b.q_t, torch.zeros_like(b.q_t[:, :256])], 1)
    s_a = torch.cat([a.scale_t, a.scale_t[:, :2]], 1)
    s_b = torch.cat([b.scale_t, b.scale_t[:, :2]], 1)
    want = grouped_wgrad.reference_kgrouped_wgrad(q_a, q_b, s_a, s_b, offs)
    kernel = registry.select(torch.device("cuda"), backend).backend
    got = _poisoned(want.shape)
    grouped_wgrad._launch(kernel, q_a, q_b, s_a, s_b, offs, got, False)
    for e in range(3):
        if want[e].any():
            assert relative_error(got[e].double(), want[e].double()) < FP32_TOLERANCE, f"expert {e}"
        else:
            assert not got[e].any(), f"expert {e} has no token after clamping: its gradient must be zero"


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_experts_than_the_kernel_takes_run_the_reference(backend, launches):
    kernel = registry.select(torch.device("cuda"), backend).backend
    counts = [1] * (kernel.kgrouped_max_experts + 1)
    offs, a, b = _operands(counts, 128, 128, seed=12)
    out = kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, backend=backend)
    assert launches[0] == 0
    _check_experts(out, kgrouped_float64(a.q_t, b.q_t, a.scale_t, b.scale_t, counts), counts, 1e-6)
