"""The gfx942 transposing quantizer (csrc/quantize.hip quantize_transposed_kernel: the core's fp8gemm/quantize_tiles.cuh
on the e4m3fnuz Arch, and its launcher csrc/launch.cpp quantize_transposed, unchanged) on the CPU emulator: the
protocol's optional quantize_transposed entry, one 128 x 128 tile per 256-work-item workgroup.

Through fp8gemm.training.quantize_with_transpose and quantize_weight_with_transpose with the emulated backend, as on an
MI300X, bit for bit against the reference in float8_e4m3fnuz (codes equal, scales bit for bit, NaN as NaN): activations
on M tails (1, 15, 129, 300: row groups of a wavefront leaving the row loop at M while the others exchange their
maxima), bf16/fp16/fp32, power-of-two scales on and off, the conformance suite's special values (zero, tie, NaN and
infinite blocks, magnitudes down to 1e-30), rows read in place at a stride wider than K; weights against
fp8gemm.quantize_weight with N a multiple of 16 but not of 128 (a partial last tile of q_t). The emulator fills every
output with NaN before each launch, and each test checks that the kernel ran, not the reference. Seeds are printed."""

from __future__ import annotations

import ctypes

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from fp8gemm import runtime
from fp8gemm.protocol import IN_BF16, PROTOCOL_VERSION, QUANTIZE_TRANSPOSED_ARGS
from fp8gemm.testing.conformance_layer import _same_codes, _same_scales, special_values
from fp8gemm.training import quantize_weight_with_transpose, quantize_with_transpose

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
gfx942_emulator = test_gfx942_emulation.gfx942_emulator
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _same(got, want) -> None:
    for field, g, w in zip(("q", "scale", "q_t", "scale_t"), got, want, strict=True):
        assert g.shape == w.shape, f"{field}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        same = _same_codes(g, w) if g.dtype != torch.float32 else _same_scales(g, w)
        assert same, f"{field} differs from the reference"


def _strided_rows(m: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """The suite's special values in rows 16 bytes wider than K, read in place (the kernel's row stride)."""
    pad = 16 // torch.tensor([], dtype=dtype).element_size()
    wide = torch.randn(m, k + pad, generator=gen).to(dtype)
    wide[:, :k] = special_values(m, k, dtype, "cpu", gen)
    return wide[:, :k]


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("m", [1, 15, 129, 300])
def test_activation_bits_equal_the_reference(emulator, mi300x, m, dtype, pow2):
    seed = 8000 + 7 * m + DTYPES.index(dtype) + 100 * pow2
    print(f"seed {seed}: m {m}, {dtype}, pow2 {pow2}")
    gen = torch.Generator().manual_seed(seed)
    k = 512  # four K blocks: room for the zero, tie, NaN and infinite blocks of row 0
    x = _strided_rows(m, k, dtype, gen)
    assert runtime.kernel_rows(x) is x and x.stride(0) != k
    want = quantize_with_transpose(x, fp8_dtype=FP8, pow2_scales=pow2, backend="reference")
    launches = emulator.quantize_transposed_launches
    got = quantize_with_transpose(x, pow2_scales=pow2)
    assert emulator.quantize_transposed_launches == launches + 1  # the kernel ran, not the reference
    assert got.q.dtype == got.q_t.dtype == FP8 and got.q_t.shape == (k, -(-m // 128) * 128)
    _same(got, want)
    pad, nan_block = got.q_t[:, m:].view(torch.uint8), got.scale_t[:, -1].isnan()  # the last block holds the pad
    assert torch.all(pad[~nan_block] == 0) and torch.all(pad[nan_block] == 0x80)  # zeros, or zeros times 1 / NaN
    q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2, backend=mi300x.name)  # the inference quantizer's bits
    assert _same_codes(got.q, q) and _same_scales(got.scale, scale) and got.scale.stride() == scale.stride()


def test_activations_with_leading_dims(emulator, mi300x):
    seed = 8100
    print(f"seed {seed}")
    x = torch.randn(2, 150, 256, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    launches = emulator.quantize_transposed_launches
    got = quantize_with_transpose(x)
    assert emulator.quantize_transposed_launches == launches + 1
    _same(got, quantize_with_transpose(x, fp8_dtype=FP8, backend="reference"))


# (n, k): N a multiple of 16 but not of 128 (q_t's last tile holds 16 or 16 + 128 ... columns), one tile, K with the
# special blocks
WEIGHTS = [(16, 512), (144, 384), (272, 512), (128, 128)]


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n,k", WEIGHTS, ids=[f"{n}x{k}" for n, k in WEIGHTS])
def test_weight_bits_equal_quantize_weight(emulator, mi300x, n, k, dtype, pow2):
    seed = 8200 + n + k + 3 * pow2 + DTYPES.index(dtype)
    print(f"seed {seed}: n {n}, k {k}, {dtype}, pow2 {pow2}")
    w = special_values(n, k, dtype, "cpu", torch.Generator().manual_seed(seed))
    q, scale = fp8gemm.quantize_weight(w, fp8_dtype=FP8, pow2_scales=pow2)
    launches = emulator.quantize_transposed_launches
    got = quantize_weight_with_transpose(w, pow2_scales=pow2)
    assert emulator.quantize_transposed_launches == launches + 1
    _same(got, (q, scale, q.t(), scale.t()))


def test_a_weight_whose_rows_are_not_a_multiple_of_16_runs_the_reference(emulator, mi300x):
    print("seed 8300")
    w = torch.randn(200, 256, generator=torch.Generator().manual_seed(8300))
    launches = emulator.quantize_transposed_launches
    got = quantize_weight_with_transpose(w)
    assert emulator.quantize_transposed_launches == launches
    q, scale = fp8gemm.quantize_weight(w, fp8_dtype=FP8)
    _same(got, (q, scale, q.t(), scale.t()))


def test_the_backend_declares_the_entry(emulator):
    assert emulator.backend().quantize_transposed is not None
    assert emulator.args_sizes()["quantize_transposed"] == QUANTIZE_TRANSPOSED_ARGS.size


def test_the_entry_refuses_what_the_protocol_rules_out(emulator):
    backend = emulator.backend()
    x = torch.randn(32, 256).to(torch.bfloat16)
    q, q_t = torch.empty(32, 256, dtype=FP8), torch.empty(256, 32, dtype=FP8)
    scale, scale_t = torch.empty(32, 2), torch.empty(256, 1)

    def call(m=32, k=256, m_t=32, blocks=0, q_t_group=0):
        backend.quantize_transposed(QUANTIZE_TRANSPOSED_ARGS.pack(
            x.data_ptr(), q.data_ptr(), scale.data_ptr(), q_t.data_ptr(), scale_t.data_ptr(), m, k, m_t, 256, 2, 1, 1,
            1, IN_BF16, 0, blocks, q_t_group, 0,
        ))  # fmt: skip

    launches = emulator.quantize_transposed_launches
    call()
    assert emulator.quantize_transposed_launches == launches + 1
    for bad in (dict(m_t=24), dict(m_t=16), dict(k=200), dict(m=0), dict(blocks=2), dict(m=17, blocks=1),
                dict(q_t_group=16), dict(q_t_group=-128)):  # fmt: skip
        with pytest.raises(gfx942_emulator.EmulationError, match="quantize_transposed: m >= 1, m_t >= m a multiple"):
            call(**bad)
    address = QUANTIZE_TRANSPOSED_ARGS.pack(*[0] * len(QUANTIZE_TRANSPOSED_ARGS.fields))
    ctypes.c_uint32.from_address(address).value = PROTOCOL_VERSION + 1
    with pytest.raises(
        gfx942_emulator.EmulationError,
        match=rf"quantize_transposed: arguments of protocol version {PROTOCOL_VERSION + 1}",
    ):
        backend.quantize_transposed(address)


@pytest.mark.parametrize("chunk_bytes", [1 << 30, 2 * 256 * 384], ids=["all-experts-at-once", "two-experts-at-a-time"])
def test_expert_weights_transposes_are_written_per_expert(emulator, mi300x, chunk_bytes, monkeypatch):
    """quantize_experts_with_transpose on the kernel: the stacked experts' [E N, K] rows in one launch a chunk, each
    expert's W^T written as its own [K, N] matrix (q_t_group N), against quantize_weight of each expert."""
    from fp8gemm.training import grouped_quantize, quantize_experts_with_transpose

    monkeypatch.setattr(grouped_quantize, "EXPERTS_CHUNK_BYTES", chunk_bytes)
    seed = 8200 + (chunk_bytes < 1 << 30)
    print(f"seed {seed}: chunk {chunk_bytes} bytes")
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(5, 256, 384, generator=gen) * torch.rand(5, 1, 1, generator=gen)).to(torch.bfloat16)
    launches = emulator.quantize_transposed_launches
    got = quantize_experts_with_transpose(w)
    assert emulator.quantize_transposed_launches == launches + (1 if chunk_bytes > 5 * 256 * 384 else 3)
    for e in range(5):
        q, scale = fp8gemm.quantize_weight(w[e], fp8_dtype=FP8)
        assert _same_codes(got.q[e], q) and _same_scales(got.scale[e], scale), f"expert {e}"
        assert _same_codes(got.q_t[e], q.t()) and _same_scales(got.scale_t[e], scale.t()), f"expert {e}"
