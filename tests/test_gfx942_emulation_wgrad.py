"""The gfx942 weight-gradient kernel (csrc/kernels.hip wgrad_kernel and its launcher csrc/launch.cpp wgrad_launch,
unchanged) on the CPU emulator: the protocol's optional wgrad_launch entry (fp8gemm/training_entries.hpp), both operands
with 1x128 scales along the contracted K, fp32 out written or added into.

Driven first through WGRAD_ARGS as the core packs them, on seeded random data (seeds printed) with strided operands
and scales and a NaN guard region around out: against the float64 product of the same FP8 operands within the
contract, bit for bit against the forward kernel on per-block scales repeated onto rows, and with accumulate on a
non-zero out. Then through fp8gemm.gemm and fp8gemm.training.linear on the emulated backend (a token count that is
not a multiple of 128: the quantizer's zero-padded last block)."""

from __future__ import annotations

import ctypes

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from fp8gemm.protocol import LAUNCH_ARGS, OUT_BF16, OUT_FP32, PROTOCOL_VERSION, WGRAD_ARGS
from fp8gemm.reference import BLOCK, reference_quantize
from fp8gemm.testing.conformance import relative_error

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
gfx942_emulator = test_gfx942_emulation.gfx942_emulator
FP32_TOLERANCE = 5e-4  # the contract's, for float32 output
GUARD_ROWS, GUARD_COLS = 8, 16  # NaN rows above and below out, NaN columns past N in each row


def _float64_product(a, b, a_scale, b_scale) -> torch.Tensor:
    """Each FP8 element dequantised with its own 1x128 scale, then one float64 matmul."""
    sa = a_scale.double().repeat_interleave(BLOCK, dim=1)
    sb = b_scale.double().repeat_interleave(BLOCK, dim=1)
    return (a.double() * sa) @ (b.double() * sb).t()


def _mn_major(scale: torch.Tensor, pad: int) -> tuple[torch.Tensor, int]:
    """[rows, K/128] as an MN-major view (column kb at kb * ld) whose leading dimension has `pad` spare NaN slots."""
    rows, kb = scale.shape
    ld = -(-(rows + pad) // 4) * 4
    buf = torch.full((kb, ld), float("nan"))
    buf[:, :rows] = scale.t()
    return buf[:, :rows].t(), ld


class Operands:
    """a [m, k], b [n, k] FP8 (rows strided), their 1x128 scales (row-major and MN-major), and out inside a guard."""

    def __init__(self, seed: int, m: int, n: int, k: int):
        print(f"seed {seed}: m {m}, n {n}, k {k}")
        gen = torch.Generator().manual_seed(seed)
        self.m, self.n, self.k = m, n, k
        a, self.a_scale = reference_quantize(torch.randn(m, k, generator=gen) * 3, FP8, False)
        rows = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.05)  # row magnitudes differ
        b, self.b_scale = reference_quantize(rows, FP8, False)
        self.a = torch.empty(m, k + 32, dtype=FP8)[:, :k]  # lda = k + 32
        self.a.copy_(a)
        self.b = torch.empty(n, k + 16, dtype=FP8)[:, :k]
        self.b.copy_(b)
        self.sa, self.sa_ld = _mn_major(self.a_scale, 4)
        self.sb, self.sb_ld = _mn_major(self.b_scale, 0)
        self.guarded = torch.full((m + 2 * GUARD_ROWS, n + GUARD_COLS), float("nan"))
        self.out = self.guarded[GUARD_ROWS : GUARD_ROWS + m, :n]

    def want(self) -> torch.Tensor:
        return _float64_product(self.a, self.b, self.a_scale, self.b_scale)

    def wgrad(self, backend, accumulate: bool, out_kind: int = OUT_FP32) -> None:
        backend.wgrad_launch(WGRAD_ARGS.pack(
            self.a.data_ptr(), self.b.data_ptr(), self.sa.data_ptr(), self.sb.data_ptr(), self.out.data_ptr(), 0,
            self.m, self.n, self.k, self.a.stride(0), self.b.stride(0), self.out.stride(0), self.sa_ld, self.sb_ld,
            int(accumulate), out_kind, 0,
        ))  # fmt: skip

    def guard_intact(self) -> bool:
        inside = torch.zeros_like(self.guarded, dtype=torch.bool)
        inside[GUARD_ROWS : GUARD_ROWS + self.m, : self.n] = True
        return bool(torch.isnan(self.guarded[~inside]).all())


# (m, n, k): both tile configs (M <= 32: 32-row tiles), tails in M and N, one K block, an odd K block count.
SHAPES = [(1, 16, 128), (32, 48, 256), (33, 144, 384), (128, 128, 128), (200, 272, 1152), (130, 400, 640)]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_wgrad_entry_matches_the_float64_product(emulator, m, n, k):
    backend = emulator.backend()
    ops = Operands(6100 + m + n, m, n, k)
    before = emulator.wgrad_launches
    ops.wgrad(backend, accumulate=False)  # the emulator poisons out (NaN) first
    assert emulator.wgrad_launches == before + 1
    assert not torch.isnan(ops.out).any() and ops.guard_intact()
    assert relative_error(ops.out, ops.want()) < FP32_TOLERANCE


@pytest.mark.parametrize("m, n, k", [(33, 144, 384), (200, 272, 1152)])
def test_accumulate_adds_into_a_non_zero_out(emulator, m, n, k):
    backend = emulator.backend()
    ops = Operands(6200 + m, m, n, k)
    start = torch.randn(m, n, generator=torch.Generator().manual_seed(6201 + m)) * 100
    ops.out.copy_(start)
    ops.wgrad(backend, accumulate=True)
    assert ops.guard_intact()
    assert relative_error(ops.out, start.double() + ops.want()) < FP32_TOLERANCE
    assert relative_error(ops.out - start, ops.want()) < 2e-3  # the product itself, not just its sum with start
    twice = ops.out.clone()
    ops.wgrad(backend, accumulate=True)
    assert relative_error(ops.out, twice.double() + ops.want()) < FP32_TOLERANCE


@pytest.mark.parametrize("m, n, k", [(32, 48, 256), (200, 272, 640)])
def test_per_row_scales_repeated_from_blocks_give_the_forward_kernels_bits(emulator, m, n, k):
    """Per-block B scales repeated onto each row of b: the same tiles, MFMAs and promotion products as the forward
    kernel (unsplit: one CU, so its plan takes every K block in one workgroup), so the same bits."""
    backend = emulator.backend()
    ops = Operands(6300 + m, m, n, k)
    blocks = torch.rand(-(-n // BLOCK), k // BLOCK, generator=torch.Generator().manual_seed(6301)) + 0.25
    ops.b_scale = blocks.repeat_interleave(BLOCK, dim=0)[:n].contiguous()
    ops.sb, ops.sb_ld = _mn_major(ops.b_scale, 4)
    forward = torch.full((m, n), float("nan"))
    emulator.use_cu_count(1)
    try:
        assert backend.workspace_bytes(m, n, k) == 0  # no split-K
        backend.launch(LAUNCH_ARGS.pack(
            ops.a.data_ptr(), ops.b.data_ptr(), ops.sa.data_ptr(), blocks.data_ptr(), forward.data_ptr(), 0, m, n, k,
            ops.a.stride(0), ops.b.stride(0), n, ops.sa_ld, blocks.stride(0), OUT_FP32, 0,
        ))  # fmt: skip
        ops.wgrad(backend, accumulate=False)
    finally:
        emulator.use_cu_count(test_gfx942_emulation.MI300X_CUS)
    assert torch.equal(ops.out, forward)


@pytest.mark.parametrize("m, n, k", [(33, 144, 384), (1, 16, 128)])
def test_bf16_out_is_the_float32_product_rounded_once(emulator, m, n, k):
    """out_kind bf16 (a bf16 weight's gradient): the fp32 result rounded once, inside the NaN guard."""
    backend = emulator.backend()
    ops = Operands(6600 + m, m, n, k)
    ops.wgrad(backend, accumulate=False)
    want = ops.out.bfloat16()
    guarded = torch.full((m + 2 * GUARD_ROWS, n + GUARD_COLS), float("nan"), dtype=torch.bfloat16)
    ops.guarded, ops.out = guarded, guarded[GUARD_ROWS : GUARD_ROWS + m, :n]
    ops.wgrad(backend, accumulate=False, out_kind=OUT_BF16)
    assert torch.equal(ops.out, want) and ops.guard_intact()
    with pytest.raises(gfx942_emulator.EmulationError, match="out_kind must be fp32, or bf16 without accumulate"):
        ops.wgrad(backend, accumulate=True, out_kind=OUT_BF16)


def test_the_entry_refuses_what_the_protocol_rules_out(emulator):
    backend = emulator.backend()
    ops = Operands(6400, 32, 48, 256)
    with pytest.raises(gfx942_emulator.EmulationError, match="wgrad_launch: m >= 1, n a positive multiple of 16"):
        backend.wgrad_launch(WGRAD_ARGS.pack(ops.a.data_ptr(), ops.b.data_ptr(), ops.sa.data_ptr(), ops.sb.data_ptr(),
                                             ops.out.data_ptr(), 0, 32, 40, 256, ops.a.stride(0), ops.b.stride(0),
                                             ops.out.stride(0), ops.sa_ld, ops.sb_ld, 0, OUT_FP32, 0))  # fmt: skip
    address = WGRAD_ARGS.pack(*[0] * len(WGRAD_ARGS.fields))
    ctypes.c_uint32.from_address(address).value = PROTOCOL_VERSION + 1
    with pytest.raises(
        gfx942_emulator.EmulationError, match=rf"wgrad_launch: arguments of protocol version {PROTOCOL_VERSION + 1}"
    ):
        backend.wgrad_launch(address)


def test_the_backend_declares_the_entry_and_its_layout(emulator):
    backend = emulator.backend()
    assert backend.wgrad_launch is not None and backend.wgrad_workspace_bytes(4096, 4096, 8192) == 0
    assert (backend.wgrad_b_scale_layout.order, backend.wgrad_b_scale_layout.ld_multiple) == ("mn_major", 4)
    assert emulator.args_sizes()["wgrad_launch"] == WGRAD_ARGS.size


def test_gemm_routes_the_per_row_form_and_accumulate_to_the_kernel(emulator, mi300x):
    gen = torch.Generator().manual_seed(6500)
    print("seed 6500")
    a, a_scale = fp8gemm.quantize_activation(torch.randn(130, 384, generator=gen) * 2)  # the backend's layout
    b, b_scale = reference_quantize(torch.randn(272, 384, generator=gen), FP8, False)  # per row, row-major
    launches, wgrads = emulator.launches, emulator.wgrad_launches
    out = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
    assert relative_error(out, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    start = torch.randn(130, 272, generator=gen)
    acc = start.clone()
    fp8gemm.gemm(a, b, a_scale, b_scale, out=acc, accumulate=True)
    assert relative_error(acc, start.double() + _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    block_b, block_scale = fp8gemm.quantize_weight(torch.randn(272, 384, generator=gen))
    acc2 = start.clone()
    fp8gemm.gemm(a, block_b, a_scale, block_scale, out=acc2, accumulate=True)  # per block: repeated onto rows
    rows = block_scale.repeat_interleave(BLOCK, dim=0)[:272]
    assert relative_error(acc2, start.double() + _float64_product(a, block_b, a_scale, rows)) < FP32_TOLERANCE
    assert (emulator.launches, emulator.wgrad_launches) == (launches, wgrads + 3)


@pytest.mark.parametrize("tokens", [200, 256])
def test_training_weight_gradient_runs_the_kernel_over_a_padded_last_block(emulator, mi300x, tokens):
    """dW = dY^T X over a token count that is not a multiple of 128 (200: x^T and dY^T zero-padded to 256 by the
    quantizer, the last scale block over its 72 real tokens) and one that is: one wgrad launch each, dW within the
    contract of the float64 product of the same FP8 operands, and within 5% of float64 autograd."""
    seed = 6600 + tokens
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, 256, generator=gen)).requires_grad_()
    weight = (torch.randn(384, 256, generator=gen) * 0.05).requires_grad_()
    dy = torch.randn(tokens, 384, generator=gen)
    wgrads = emulator.wgrad_launches
    fp8gemm.training.linear(x, weight).backward(dy)
    assert emulator.wgrad_launches == wgrads + 1
    xq = fp8gemm.training.quantize_with_transpose(x.detach(), fp8_dtype=FP8)
    dq = fp8gemm.training.quantize_with_transpose(dy, fp8_dtype=FP8)
    assert xq.q_t.shape == (256, 256) and torch.all(xq.q_t[:, tokens:].float() == 0)
    want = _float64_product(dq.q_t, xq.q_t, dq.scale_t, xq.scale_t)
    assert relative_error(weight.grad, want) < FP32_TOLERANCE
    assert relative_error(weight.grad, dy.double().t() @ x.detach().double()) < 0.05
