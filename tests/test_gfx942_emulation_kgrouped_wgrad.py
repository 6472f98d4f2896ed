"""The gfx942 k-grouped weight-gradient kernel (csrc/kernels.hip kgrouped_wgrad_kernel and its launcher csrc/launch.cpp
kgrouped_wgrad_launch, unchanged) on the CPU emulator: the protocol's optional kgrouped_wgrad_launch entry, every
expert's dW_e = dY_e^T X_e in one launch on the per-expert 128-aligned layout of quantize_grouped_with_transpose.

Every expert against float64 of the same FP8 operands within the weight-gradient contract (seeds printed): empty and
partial experts, both tile configs, more experts than a workgroup has work-items, out[e] strided inside a NaN guard;
bf16 out as the fp32 result rounded once; accumulate adding into out and leaving an empty expert's bits untouched;
offs the host never checks (out of order, negative, past the layout) clamped as the core's reference clamps them, with
non-zero codes in the gap blocks; the launcher's refusals."""

from __future__ import annotations

import ctypes

import pytest
import test_gfx942_emulation
import torch
from fp8gemm.moe_reference import dequantize64
from fp8gemm.protocol import KGROUPED_WGRAD_ARGS, OUT_BF16, OUT_FP32, PROTOCOL_VERSION
from fp8gemm.reference import BLOCK, reference_quantize
from fp8gemm.testing.conformance import relative_error
from fp8gemm.training import grouped_wgrad, kgrouped_wgrad, quantize_grouped_with_transpose
from fp8gemm.training.grouped_quantize import block_experts, expert_columns
from kgrouped_float64 import kgrouped_float64

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
gfx942_emulator = test_gfx942_emulation.gfx942_emulator
FP32_TOLERANCE, BF16_TOLERANCE = 5e-4, 4e-3  # the weight-gradient contract's, for float32 and bf16 output


def _operands(counts, n, k, seed):
    """offs and the FP8 transposes of dY [T, n] and X [T, k] for ``counts`` tokens per expert (rows at different
    scales), quantized with the backend's grouped quantizer at widths of whole 128 blocks, then their first n and k
    rows (the layout's rows are independent)."""
    print(f"seed {seed}: {len(counts)} experts, {sum(counts)} tokens, N {n}, K {k}")
    gen = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    transposes = []
    for width in (n, k):
        source = torch.randn(rows, -(-width // BLOCK) * BLOCK, generator=gen)
        source *= torch.rand(rows, 1, generator=gen) * 4 + 0.1
        q = quantize_grouped_with_transpose(source, offs, fp8_dtype=FP8)
        transposes.append((q.q_t[:width], q.scale_t[:width]))
    (a_t, a_scale_t), (b_t, b_scale_t) = transposes
    return offs, a_t, b_t, a_scale_t, b_scale_t


def _float64_of_the_references_experts(a_t, b_t, a_scale_t, b_scale_t, offs) -> torch.Tensor:
    """float64 [E, N, K]: each column block's product summed into the expert the core's reference gives it (offs
    clamped), blocks of no expert dropped."""
    experts, (n, columns), k = offs.shape[0], a_t.shape, b_t.shape[0]
    blocks = columns // BLOCK
    owner = block_experts(expert_columns(offs, grouped_wgrad.rows_bound(blocks, experts)), blocks)
    a64 = dequantize64(a_t, a_scale_t).view(n, blocks, BLOCK).transpose(0, 1)
    b64 = dequantize64(b_t, b_scale_t).view(k, blocks, BLOCK).transpose(0, 1)
    summed = torch.zeros(experts + 1, n, k, dtype=torch.float64).index_add_(0, owner, a64 @ b64.transpose(1, 2))
    return summed[:experts]


def _check_experts(got, want, tolerance) -> None:
    for e in range(want.shape[0]):
        if not want[e].any():
            assert not got[e].any() and not got[e].signbit().any(), f"expert {e} has no token: its gradient is +0.0"
        else:
            err = relative_error(got[e].double(), want[e])
            assert err < tolerance, f"expert {e}: {err:.2e} from float64"


def _guarded(experts, n, k, dtype=torch.float32):
    """A NaN buffer and out [E, n, k] inside it: a row gap between experts and 16 spare columns in each row."""
    guard = torch.full((experts, n + 2, k + 16), float("nan"), dtype=dtype)
    return guard, guard[:, 1 : n + 1, :k]


def _guard_intact(guard, n, k) -> bool:
    inside = torch.zeros_like(guard, dtype=torch.bool)
    inside[:, 1 : n + 1, :k] = True
    return bool(torch.isnan(guard[~inside]).all())


# (counts, N, K): partial blocks (1, 127, 129, 300 tokens), empty experts between and at the ends, every expert empty,
# 32-row tiles (N <= 32) and 128-row tiles with an N tail, a K tail in the tile's columns, and 300 experts (each of
# the workgroup's 256 work-items scans more than one of the earlier ends).
CASES = [
    ([1, 127, 128, 129, 300], 48, 32),
    ([129, 0, 0, 127, 1, 0, 300], 32, 144),
    ([0, 0], 16, 16),
    ([0, 700, 0], 160, 48),
    ([3 * (e % 5) for e in range(300)], 16, 16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{len(c[0])}-T{sum(c[0])}-{c[1]}x{c[2]}")
def test_every_expert_against_float64_of_the_same_fp8_operands(emulator, mi300x, case):
    counts, n, k = case
    offs, *operands = _operands(counts, n, k, seed=7000 + len(counts) + n)
    want = kgrouped_float64(*operands, counts)
    guard, out = _guarded(len(counts), n, k)
    launches = emulator.kgrouped_wgrad_launches
    assert kgrouped_wgrad(*operands, offs, out=out) is out
    assert emulator.kgrouped_wgrad_launches == launches + 1  # the kernel, not the reference
    assert _guard_intact(guard, n, k)
    _check_experts(out, want, FP32_TOLERANCE)
    bf16_guard, bf16 = _guarded(len(counts), n, k, torch.bfloat16)
    kgrouped_wgrad(*operands, offs, out=bf16)
    assert torch.equal(bf16, out.bfloat16()) and _guard_intact(bf16_guard, n, k)  # the fp32 result rounded once
    _check_experts(bf16, want, BF16_TOLERANCE)
    assert emulator.kgrouped_wgrad_launches == launches + 2


def test_accumulate_adds_and_leaves_empty_experts_bits_untouched(emulator, mi300x):
    counts = [200, 0, 57, 0, 300]
    offs, *operands = _operands(counts, 48, 32, seed=7100)
    start = torch.randn(len(counts), 48, 32, generator=torch.Generator().manual_seed(7101)) * 10
    start[1, 0, 0] = -0.0  # untouched means its bits too: -0.0 + 0.0 would be +0.0
    product = kgrouped_wgrad(*operands, offs)
    _check_experts(product, kgrouped_float64(*operands, counts), FP32_TOLERANCE)
    out = start.clone()
    kgrouped_wgrad(*operands, offs, out=out, accumulate=True)
    assert torch.equal(out[[0, 2, 4]], start[[0, 2, 4]] + product[[0, 2, 4]])  # one fp32 add onto each element
    assert torch.equal(out[[1, 3]].view(torch.int32), start[[1, 3]].view(torch.int32))


def _layout_with_full_gaps(n, k, blocks, seed):
    """Random FP8 codes in every column block of a [n | k, 128 blocks] layout, gap blocks included (non-zero: an expert
    that reads one it does not own is caught), with per-row 1x128 scales."""
    gen = torch.Generator().manual_seed(seed)
    a, a_scale = reference_quantize(torch.randn(n, BLOCK * blocks, generator=gen), FP8, False)
    b, b_scale = reference_quantize(torch.randn(k, BLOCK * blocks, generator=gen) * 3, FP8, False)
    return a, b, a_scale, b_scale


# Ends out of order, negative, at the most and past it (bound 128 * (blocks - E) - 1), and 260 random ones.
UNCHECKED = [
    ([300, 100, 200], 6),
    ([-5, 50, 10_000], 6),
    ([2**31 - 1, -(2**31), 7], 6),
    ([0, 383, 383], 6),
    (torch.randint(-100, 700, (260,), generator=torch.Generator().manual_seed(7200)).tolist(), 264),
]


@pytest.mark.parametrize("ends, blocks", UNCHECKED, ids=["unordered", "past", "int32", "at-bound", "E260"])
def test_unchecked_offs_are_clamped_as_the_reference_clamps_them(emulator, mi300x, ends, blocks):
    """offs straight to the entry (the host reads no value of a GPU's): each expert gets the blocks the core's
    reference gives it, the other blocks (gaps, and tokens past the last clamped end) add nothing."""
    print(f"seed 7200: offs {ends[:8]}..., {blocks} blocks")
    operands = _layout_with_full_gaps(16, 32, blocks, seed=7300 + len(ends))
    offs = torch.tensor(ends, dtype=torch.int32)
    want = _float64_of_the_references_experts(*operands, offs)
    reference = grouped_wgrad.reference_kgrouped_wgrad(*operands, offs)
    assert torch.equal(want.bool().any(2).any(1), reference.bool().any(2).any(1))  # the same empty experts
    got = torch.full(want.shape, float("nan"))
    launches = emulator.kgrouped_wgrad_launches
    grouped_wgrad._launch(mi300x, *operands, offs, got, False)
    assert emulator.kgrouped_wgrad_launches == launches + 1
    _check_experts(got, want, FP32_TOLERANCE)


def _pack(ops, out, offs, *, experts, n=32, k=256, accumulate=0, out_kind=OUT_FP32) -> int:
    a, b, a_scale, b_scale = ops
    return KGROUPED_WGRAD_ARGS.pack(a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr(),
                                    offs.data_ptr(), 16, n, k, experts, a.stride(0), b.stride(0), n, 16 * n, 16, 32,
                                    accumulate, out_kind, 0)  # fmt: skip


def test_the_entry_refuses_what_the_protocol_rules_out(emulator, mi300x):
    ops = _layout_with_full_gaps(16, 32, 2, seed=7400)
    ops = (ops[0], ops[1], ops[2].t().contiguous(), ops[3].t().contiguous())  # MN-major scales: ld 16 and 32
    out, offs = torch.zeros(3, 16, 32), torch.tensor([10, 20, 30], dtype=torch.int32)
    launches = emulator.kgrouped_wgrad_launches
    mi300x.kgrouped_wgrad_launch(_pack(ops, out, offs, experts=1))  # a well-formed call runs
    layout = r"kgrouped_wgrad_launch: 1 <= experts <= 2048 and k >= 128 \* \(experts \+ 1\)"
    for experts in (0, 2, 2049):  # two experts need three blocks
        with pytest.raises(gfx942_emulator.EmulationError, match=layout):
            mi300x.kgrouped_wgrad_launch(_pack(ops, out, offs, experts=experts))
    with pytest.raises(gfx942_emulator.EmulationError, match="kgrouped_wgrad_launch: m >= 1, n a positive multiple"):
        mi300x.kgrouped_wgrad_launch(_pack(ops, out, offs, experts=1, n=40))
    with pytest.raises(gfx942_emulator.EmulationError, match="out_kind must be fp32, or bf16 without accumulate"):
        mi300x.kgrouped_wgrad_launch(_pack(ops, out, offs, experts=1, accumulate=1, out_kind=OUT_BF16))
    address = KGROUPED_WGRAD_ARGS.pack(*[0] * len(KGROUPED_WGRAD_ARGS.fields))
    ctypes.c_uint32.from_address(address).value = PROTOCOL_VERSION + 1
    with pytest.raises(gfx942_emulator.EmulationError, match=rf"arguments of protocol version {PROTOCOL_VERSION + 1}"):
        mi300x.kgrouped_wgrad_launch(address)
    assert emulator.kgrouped_wgrad_launches == launches + 7


def test_the_backend_declares_the_entry(emulator):
    backend = emulator.backend()
    assert backend.kgrouped_wgrad_launch is not None and backend.kgrouped_max_experts == 2048
    assert emulator.args_sizes()["kgrouped_wgrad_launch"] == KGROUPED_WGRAD_ARGS.size
