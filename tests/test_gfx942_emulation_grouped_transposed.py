"""The gfx942 grouped transposing quantizer (csrc/quantize.hip quantize_grouped_transposed_kernel: the core's
fp8gemm/quantize_grouped_tiles.cuh on the e4m3fnuz Arch, and its launcher csrc/launch.cpp, unchanged) on the CPU
emulator: the protocol's optional quantize_grouped_transposed entry, one (column block, K block) per workgroup.

Through fp8gemm.training.quantize_grouped_with_transpose with the emulated backend, as on an MI300X, bit for bit
against the reference in float8_e4m3fnuz (codes equal, scales bit for bit, NaN as NaN): the expert count patterns of
tests/test_training_grouped_quantize.py (empty experts, partial blocks, one expert holding everything), every split of
two experts around the block boundaries, bf16/fp16/fp32 with the conformance suite's special values and power-of-two
scales, rows past offs[-1] (q only), offs all zero; and through the entry directly, offs the host never checks (out of
order, negative, past M), which the kernel clamps as the reference does. The emulator fills every output with NaN
before each launch, and each test checks that the kernel ran, not the reference. Seeds are printed."""

from __future__ import annotations

import pytest
import test_gfx942_emulation
import test_training_grouped_quantize
import torch
from fp8gemm import runtime
from fp8gemm.reference import SCALE_FLOOR
from fp8gemm.testing.conformance_layer import _same_codes, _same_scales, special_values
from fp8gemm.training import grouped_quantize, quantize_grouped_with_transpose

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
gfx942_emulator = test_gfx942_emulation.gfx942_emulator
COUNTS = test_training_grouped_quantize.COUNTS
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _rows(counts, k=256, extra=0, dtype=torch.bfloat16, seed=0):
    return test_training_grouped_quantize._rows(counts, k=k, extra=extra, dtype=dtype, seed=seed)


def _same(got, want) -> None:
    for field, g, w in zip(("q", "scale", "q_t", "scale_t"), got, want, strict=True):
        assert g.shape == w.shape, f"{field}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        same = _same_codes(g, w) if g.dtype != torch.float32 else _same_scales(g, w)
        assert same, f"{field} differs from the reference"


def _kernel_matches_reference(emulator, x, offs, pow2=False):
    """The emulated kernel's four outputs against the reference's, and that the kernel (not the reference) ran."""
    want = quantize_grouped_with_transpose(x, offs, fp8_dtype=FP8, pow2_scales=pow2, backend="reference")
    launches = emulator.quantize_grouped_transposed_launches
    got = quantize_grouped_with_transpose(x, offs, pow2_scales=pow2)
    assert emulator.quantize_grouped_transposed_launches == launches + 1  # the kernel ran, not the reference
    assert got.q.dtype == got.q_t.dtype == FP8
    _same(got, want)
    return got


@pytest.mark.parametrize("counts", COUNTS, ids=["-".join(map(str, c)) for c in COUNTS])
def test_expert_counts_bits_equal_the_reference(emulator, mi300x, counts):
    x, offs = _rows(counts, seed=len(counts) + sum(counts))
    if not x.shape[0]:  # no rows: the reference runs (the kernel needs M >= 1)
        launches = emulator.quantize_grouped_transposed_launches
        quantize_grouped_with_transpose(x, offs)
        assert emulator.quantize_grouped_transposed_launches == launches
        return
    _kernel_matches_reference(emulator, x, offs)


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_special_values_and_rows_of_no_expert(emulator, mi300x, dtype, pow2):
    """The suite's special values (zero, tie, NaN and infinite blocks, tiny magnitudes) in rows sorted over four
    experts, and 70 rows past offs[-1]: quantized in q, absent from q_t."""
    counts, seed = [130, 0, 5, 200], 9000 + DTYPES.index(dtype) + 10 * pow2
    print(f"seed {seed}: {dtype}, pow2 {pow2}")
    x, offs = _rows(counts, k=512, extra=70, dtype=dtype, seed=seed)
    x[:] = special_values(x.shape[0], 512, dtype, "cpu", torch.Generator().manual_seed(seed))
    _kernel_matches_reference(emulator, x, offs, pow2)


def test_strided_rows_read_in_place(emulator, mi300x):
    wide, offs = _rows([40, 100, 3], k=256 + 8, seed=21)
    x = wide[:, :256]
    assert runtime.kernel_rows(x) is x and x.stride(0) != 256
    _kernel_matches_reference(emulator, x, offs)


def test_splits_of_two_experts(emulator, mi300x):
    """Two experts over M = 257 tokens, the first's count around every block boundary (0, 1, 127..129, 255..257)."""
    x, _ = _rows([257], k=128, seed=4)
    for first in (0, 1, 2, 127, 128, 129, 200, 255, 256, 257):
        _kernel_matches_reference(emulator, x, torch.tensor([first, 257], dtype=torch.int32))


def test_more_experts_than_a_workgroup_searches_at_once(emulator, mi300x):
    """300 experts: the search scans offs in two chunks of 256, the running end carried across (empty experts, runs of
    single tokens and a block-sized one past the chunk boundary)."""
    counts = [(e * 7) % 3 for e in range(300)]
    counts[260] = 130
    x, offs = _rows(counts, k=128, extra=5, seed=41)
    _kernel_matches_reference(emulator, x, offs)


def test_rows_of_no_expert_at_all(emulator, mi300x):
    """offs all zero: the column blocks past q_t's write every row's q; x^T is all gap."""
    x, _ = _rows([300], seed=15)
    got = _kernel_matches_reference(emulator, x, torch.zeros(3, dtype=torch.int32))
    assert not got.q_t.view(torch.uint8).any() and torch.equal(got.scale_t, torch.full_like(got.scale_t, SCALE_FLOOR))


def _launch(backend, x, offs, pow2=False):
    """The entry on offs as given (no host check), into outputs as the core allocates them."""
    rows, k = x.shape
    blocks = grouped_quantize.grouped_blocks(rows, offs.shape[0])
    q = x.new_empty((rows, k), dtype=FP8)
    scale, _ = runtime.empty_scale(rows, k // 128, backend.a_scale_layout, x.device)
    q_t, scale_t = x.new_empty((k, blocks * 128), dtype=FP8), x.new_empty((k, blocks), dtype=torch.float32)
    runtime.call_quantize_grouped_transposed(backend, x, offs, q, scale, q_t, scale_t, pow2)
    return q, scale, q_t, scale_t


# offs only the device reads: out of order, negative, past M; each end is clamped to [previous end, M]
UNCHECKED_OFFS = [[300, 100, 200], [-5, 50, 10_000], [400, 400, 2], [2**31 - 1, -(2**31), 7]]


@pytest.mark.parametrize("ends", UNCHECKED_OFFS, ids=["-".join(map(str, e)) for e in UNCHECKED_OFFS])
def test_unchecked_offs_are_clamped_as_the_reference_clamps_them(emulator, mi300x, ends):
    x, _ = _rows([260], seed=31)
    offs = torch.tensor(ends, dtype=torch.int32)
    want = grouped_quantize._reference_grouped(x, offs, FP8, False, "reference")
    _same(_launch(mi300x, x, offs), want)


def test_a_q_t_of_another_width_is_refused(emulator, mi300x):
    x, offs = _rows([10, 20], seed=33)
    q, scale = x.new_empty((30, 256), dtype=FP8), x.new_empty((30, 2), dtype=torch.float32)
    q_t, scale_t = x.new_empty((256, 128 * 2), dtype=FP8), x.new_empty((256, 2), dtype=torch.float32)
    with pytest.raises(gfx942_emulator.EmulationError, match=r"columns must be 128 \* \(experts \+ m / 128 \+ 1\)"):
        runtime.call_quantize_grouped_transposed(mi300x, x, offs, q, scale, q_t, scale_t, False)
