"""The gfx942 grouped transposing quantizer on a row source (csrc/quantize.hip quantize_grouped_source_kernel: the
core's fp8gemm/quantize_sources.cuh on the e4m3fnuz Arch, and its launcher csrc/launch.cpp, unchanged) on the CPU
emulator: the rows of a gather (with and without row weights, an index outside x reading a zero row), of SiLU-and-mul
and of its gradient computed as they are loaded, one (column block, K block) per workgroup.

Through fp8gemm.training.grouped_sources with the emulated backend, as on an MI300X, against the reference:
``quantize_grouped_with_transpose`` of the torch composition (grouped_sources._compose) in float8_e4m3fnuz. The gather
involves no rounding beyond the reference's, so its codes and scales are bit for bit the reference's. SiLU's exp is
the C library's expf in the emulator and torch's vectorised one in the composition, an ulp or so apart, which SiLU's
gradient magnifies where 1 + g * (1 - sigmoid(g)) cancels: there codes must equal the reference's on 99% (the rest one
step apart), scales and dequantized values (q * scale against the composition's fp32 rows) stay within a rounding
allowance. Measured over the SiLU cases below: 0 of 3.8 million codes differ; 743 of 30 thousand scales differ, by
up to 2 ulps for SwiGLU and 120 ulps for its gradient (a one-token block whose value nearly cancels), a quarter of the
allowance at most; every dequantized value within half an FP8 step beyond the allowance (0.99998 of it at most). The
emulator fills every output with NaN before each launch, tests that allocate outputs poison them too, and each test
checks that the kernel ran. Seeds are printed."""

from __future__ import annotations

import pytest
import test_gfx942_emulation
import torch
from fp8gemm import runtime
from fp8gemm.protocol import SOURCE_GATHER, SOURCE_SWIGLU, SOURCE_SWIGLU_BACKWARD
from fp8gemm.testing.conformance_layer import _same_codes, _same_scales
from fp8gemm.training import grouped_quantize, quantize_grouped_with_transpose
from fp8gemm.training.grouped_sources import (
    _compose,
    quantize_gathered_with_transpose,
    quantize_swiglu_backward_with_transpose,
    quantize_swiglu_with_transpose,
)
from fp8gemm.training.quantize import scale_t_layout

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
gfx942_emulator = test_gfx942_emulation.gfx942_emulator
SEED = 7_300
# an empty expert, a partial block, more than a block, one row; rows past offs[-1] belong to no expert
COUNTS, EXTRA = [0, 70, 0, 200, 1], 40
# the SiLU sources: codes equal on at least this share (a tie flipped by an ulp of exp), the others one step apart
MIN_SAME_CODES = 0.99
# fp32 rounding of each source's formula, in ulps of its terms: the kernel's and torch's exp differ by an ulp, and
# SiLU's gradient 1 + g * (1 - s) magnifies an ulp of s = sigmoid(g) by |g| (measured: a quarter of this at most)
ROUNDING_ULPS = 16


def _gen(seed: int) -> torch.Generator:
    print(f"seed {SEED + seed}")
    return torch.Generator().manual_seed(SEED + seed)


def _random(shape, gen, dtype=torch.float32) -> torch.Tensor:
    """Rows at different magnitudes (a block's amax shows), never zero."""
    magnitude = torch.rand(shape[0], 1, generator=gen) * 4 + 0.1
    values = (torch.randn(shape, generator=gen) * magnitude).to(dtype)
    return values.masked_fill_(values == 0, 0.5)


def _offs(counts=COUNTS) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


def _ran(emulator, call):
    launches = emulator.quantize_grouped_transposed_launches
    got = call()
    assert emulator.quantize_grouped_transposed_launches == launches + 1  # the kernel ran, not the composition
    assert got.q.dtype == got.q_t.dtype == FP8
    return got


def _reference(rows: torch.Tensor, offs: torch.Tensor):
    return quantize_grouped_with_transpose(rows, offs, fp8_dtype=FP8, backend="reference")


def _bits_equal(got, want) -> None:
    for field, g, w in zip(("q", "scale", "q_t", "scale_t"), got, want, strict=True):
        assert g.shape == w.shape, f"{field}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        assert (_same_codes if g.dtype != torch.float32 else _same_scales)(g, w), f"{field} differs from the reference"


def _dequantized(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.repeat_interleave(128, dim=1)


def _half_step(exact: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Half the FP8 step at exact's magnitude (e4m3fnuz: 3 mantissa bits, normals from 2^-7 of 240 * scale)."""
    s = scale.repeat_interleave(128, dim=1)
    unscaled = (exact / s).abs().clamp(min=2.0**-7)
    return torch.exp2(torch.floor(torch.log2(unscaled)) - 4) * s


def _block_max(values: torch.Tensor) -> torch.Tensor:
    return values.unflatten(1, (-1, 128)).amax(-1)


def _near(got, want, rows: torch.Tensor, offs: torch.Tensor, allowance: torch.Tensor) -> None:
    """The SiLU sources against the composition, where kernel and torch may round a value `allowance` apart: each
    scale within its block's largest allowance (over 240) of the reference's, codes equal on MIN_SAME_CODES and
    otherwise one step apart (same sign), q and the transposed q_t within half an FP8 step plus the allowance of the
    composition's fp32 rows."""
    layouts = ((rows, allowance), (_layout_t(rows, offs), _layout_t(allowance, offs)))
    for field, g, w, (_, allow) in zip(("scale", "scale_t"), got[1::2], want[1::2], layouts, strict=True):
        assert g.shape == w.shape and not torch.isnan(g).any(), field
        off = ((g - w).abs() * 240 / _block_max(allow).clamp(min=2.0**-149)).max().item()
        ulps = ((g - w).abs() / w / 2.0**-23).max().item()
        print(f"{field}: {int((g != w).sum())} of {g.numel()} differ, {ulps:.1f} ulps, {off:.3f} allowances at most")
        assert off <= 1, f"{field}: a scale further from the reference than the rounding allows"
    for field, g, w in zip(("q", "q_t"), got[0::2], want[0::2], strict=True):
        assert g.shape == w.shape and not torch.isnan(g.float()).any(), field
        gb, wb = g.view(torch.uint8).int(), w.view(torch.uint8).int()
        differ = gb != wb
        assert ((gb[differ] ^ wb[differ]) & 0x80 == 0).all(), f"{field}: a code changed sign"
        assert ((gb[differ] - wb[differ]).abs() == 1).all(), f"{field}: a code more than one step off"
        same = 1 - differ.float().mean().item()
        print(f"{field}: {int(differ.sum())} of {g.numel()} codes differ from the reference")
        assert same >= MIN_SAME_CODES, f"{field}: only {same:.2%} of codes equal the reference's"
    for field, q, scale, (exact, allow) in zip(("q", "q_t"), got[0::2], got[1::2], layouts, strict=True):
        error = (_dequantized(q, scale) - exact).abs() - allow
        ratio = (error / _half_step(exact, scale)).max().item()
        print(f"{field}: max |q * scale - rows| = {ratio:.6f} half FP8 steps beyond the allowance")
        assert ratio <= 1, f"{field}: a dequantized value more than half a step off the composition"


def _layout_t(rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """rows^T in the per-expert 128-aligned layout of q_t (gap columns zero)."""
    m = rows.shape[0]
    out = torch.zeros(rows.shape[1], grouped_quantize.grouped_blocks(m, offs.shape[0]) * 128)
    start = 0
    for e, end in enumerate(offs.tolist()):
        column = 128 * (e + start // 128)
        out[:, column : column + end - start] = rows[start:end].T
        start = end
    return out


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "row-weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=lambda d: str(d)[6:])
def test_gather_bits_equal_the_reference(emulator, mi300x, dtype, weighted):
    """x[index] (times row_weight in fp32) from a wider x in strided rows, index out of order with repeats."""
    gen = _gen(10 * weighted + [torch.bfloat16, torch.float16, torch.float32].index(dtype))
    offs, tokens = _offs(), 150
    m = int(offs[-1]) + EXTRA
    x = _random((tokens, 256 + 16), gen, dtype)[:, :256]
    assert runtime.kernel_rows(x) is x and x.stride(0) != 256
    index = torch.randint(0, tokens, (m,), generator=gen)
    weight = torch.rand(m, generator=gen) * 2 + 0.25 if weighted else None
    got = _ran(emulator, lambda: quantize_gathered_with_transpose(x, index, offs, row_weight=weight))
    _bits_equal(got, _reference(_compose(SOURCE_GATHER, x, index, weight, None), offs))


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "row-weight"])
def test_gather_index_outside_x_reads_a_zero_row(emulator, mi300x, weighted):
    """Indices the host never checks (negative, x's row count, far past it) read zero rows, weighted or not; a row
    all zero quantizes as the reference's all-zero block in q and q_t."""
    gen = _gen(20 + weighted)
    offs, tokens = _offs(), 90
    m = int(offs[-1]) + EXTRA
    x = _random((tokens, 384), gen, torch.bfloat16)
    index = torch.randint(0, tokens, (m,), generator=gen)
    outside = torch.tensor([0, 5, 69, 70, 71, 200, m - 1])  # in experts 1 and 3, either side of a block, past offs
    index[outside] = torch.tensor([-1, tokens, -(2**62), 2**40, tokens + 1, -7, tokens])
    weight = torch.rand(m, generator=gen) + 0.5 if weighted else None
    got = _ran(emulator, lambda: quantize_gathered_with_transpose(x, index, offs, row_weight=weight))
    inside = (index >= 0) & (index < tokens)
    rows = _compose(SOURCE_GATHER, x, torch.where(inside, index, 0), weight, None)
    rows[~inside] = 0
    _bits_equal(got, _reference(rows, offs))
    assert not got.q[outside].view(torch.uint8).any()


@pytest.mark.parametrize("counts", [COUNTS, [300], [0, 0, 129]], ids=["mixed", "one-expert", "trailing-expert"])
def test_swiglu_matches_the_composition(emulator, mi300x, counts):
    """silu(h[:, :I]) * h[:, I:] from fp32 h [M, 2I], I = 256."""
    gen = _gen(30 + len(counts))
    offs = _offs(counts)
    h = _random((int(offs[-1]) + EXTRA, 512), gen)
    got = _ran(emulator, lambda: quantize_swiglu_with_transpose(h, offs))
    rows = _compose(SOURCE_SWIGLU, h, None, None, None)
    _near(got, _reference(rows, offs), rows, offs, rows.abs() * ROUNDING_ULPS * 2.0**-24)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=lambda d: str(d)[6:])
def test_swiglu_backward_matches_the_composition(emulator, mi300x, dtype):
    """[silu'(gate) * (d * up) | silu(gate) * d] from fp32 d [M, I] and h [M, 2I] of `dtype` in strided rows, I =
    128 (each half one K block) and 256."""
    for inter in (128, 256):
        gen = _gen(40 + inter + [torch.bfloat16, torch.float16, torch.float32].index(dtype))
        offs = _offs()
        m = int(offs[-1]) + EXTRA
        d = _random((m, inter), gen)
        h = _random((m, 2 * inter + 8), gen, dtype)[:, : 2 * inter]
        got = _ran(emulator, lambda: quantize_swiglu_backward_with_transpose(d, h, offs))  # noqa: B023
        rows = _compose(SOURCE_SWIGLU_BACKWARD, d, None, None, h)
        _near(got, _reference(rows, offs), rows, offs, _backward_allowance(d, h, rows))


def _backward_allowance(d: torch.Tensor, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rounding room of the gradient: ROUNDING_ULPS of d * up * (1 + |gate|) in the first half (where the terms of
    1 + g * (1 - s) cancel, their size, not the result's, sets it), of the result in the second."""
    inter = d.shape[1]
    gate, up = h[:, :inter].float(), h[:, inter:].float()
    terms = torch.cat([(d * up).abs() * (1 + gate.abs()), rows[:, inter:].abs()], dim=1)
    return terms * ROUNDING_ULPS * 2.0**-24


def _outputs(m: int, k: int, experts: int, backend):
    """Outputs as the core allocates them, poisoned: codes 0xFF (NaN), scales NaN."""
    blocks = grouped_quantize.grouped_blocks(m, experts)
    q = torch.full((m, k), 0xFF, dtype=torch.uint8).view(FP8)
    scale, _ = runtime.empty_scale(m, k // 128, backend.a_scale_layout, torch.device("cpu"))
    q_t = torch.full((k, blocks * 128), 0xFF, dtype=torch.uint8).view(FP8)
    scale_t, _ = runtime.empty_scale(k, blocks, scale_t_layout(backend), torch.device("cpu"))
    return q, scale.fill_(float("nan")), q_t, scale_t.fill_(float("nan"))


BAD_SOURCES = {  # source, x's dtype, whether h is passed, the refusal
    "unknown-source": (7, torch.float32, False, r"unknown source 7"),
    "swiglu-bf16-h": (SOURCE_SWIGLU, torch.bfloat16, False, r"the SwiGLU source reads fp32 h"),
    "backward-bf16-d": (SOURCE_SWIGLU_BACKWARD, torch.bfloat16, True, r"the SwiGLU backward source reads fp32 d"),
    "backward-no-h": (SOURCE_SWIGLU_BACKWARD, torch.float32, False, r"the SwiGLU backward source reads fp32 d"),
    "gather-no-index": (SOURCE_GATHER, torch.float32, False, r"the gather source needs index"),
}


@pytest.mark.parametrize("case", BAD_SOURCES, ids=list(BAD_SOURCES))
def test_a_bad_source_is_refused_before_any_kernel_runs(emulator, mi300x, case):
    """The entry, called directly, refuses a source it has no kernel for, by name, and writes nothing."""
    source, dtype, with_h, message = BAD_SOURCES[case]
    gen = _gen(50)
    offs = _offs([20, 30])
    x = _random((50, 128), gen, dtype)
    outputs = _outputs(50, 256, 2, mi300x)
    args = runtime.RowSourceArgs(source, gate_up=_random((50, 256), gen) if with_h else None)
    with pytest.raises(gfx942_emulator.EmulationError, match=rf"quantize_grouped_transposed: {message}"):
        runtime.call_quantize_grouped_transposed(mi300x, x, offs, *outputs, False, args)
    q, scale, q_t, scale_t = outputs
    assert (q.view(torch.uint8) == 0x80).all() and (q_t.view(torch.uint8) == 0x80).all()  # the emulator's poison
    assert scale.isnan().all() and scale_t.isnan().all()
