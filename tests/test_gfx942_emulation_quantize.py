"""The gfx942 activation quantizer (csrc/quantize.hip and its launcher, unchanged) on the CPU emulator,
through fp8gemm.quantize_activation and fp8gemm.linear as on an MI300X: bit-identical to the pure-torch
reference on the conformance suite's cases (special values, M tails that return lanes from the 16-lane
maximum, strided rows, bf16/fp16/fp32 inputs, power-of-two scales), and linear with the emulated
backend doing both the quantization and the GEMM. Outputs are poisoned before every launch."""

from __future__ import annotations

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from fp8gemm import reference, runtime
from fp8gemm.testing import conformance_layer

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run

QUANT_CASES = conformance_layer.quant_cases()
LINEAR_CASES = conformance_layer.LINEAR_CASES


@pytest.mark.parametrize("case", QUANT_CASES, ids=[c.id for c in QUANT_CASES])
def test_quantize_conformance(case, emulator, mi300x):
    launches = emulator.quantize_launches
    ok, detail = conformance_layer.run_quant_case(case, "cpu", mi300x.name)
    assert ok, f"{case.id}: {detail}"
    assert emulator.quantize_launches == launches + (case.m > 0)  # the kernel ran, not the reference


def _strided_rows(m: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Rows 16 bytes wider than K (read in place, so the kernel's row stride is exercised) holding
    the suite's special values."""
    pad = 16 // torch.tensor([], dtype=dtype).element_size()
    wide = torch.randn(m, k + pad, generator=gen).to(dtype)
    wide[:, :k] = conformance_layer.special_values(m, k, dtype, "cpu", gen)
    return wide[:, :k]


@pytest.mark.parametrize("dtype", conformance_layer.IN_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("m", [1, 4, 15, 16, 31, 50])
def test_row_tails_and_strides(emulator, mi300x, m, dtype):
    """Every M modulo the 16 rows of a workgroup and the 4 rows of a wavefront, rows read in place."""
    gen = torch.Generator().manual_seed(1000 * m + len(str(dtype)))
    x = _strided_rows(m, 512, dtype, gen)
    assert runtime.kernel_rows(x) is x
    for pow2 in (False, True):
        q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2, backend=mi300x.name)
        want_q, want_scale = reference.reference_quantize(x, FP8, pow2)
        assert q.dtype == FP8 and scale.stride() == (1, mi300x.a_scale_layout.ld_multiple * -(-m // 4))
        assert conformance_layer._same_scales(scale, want_scale), f"pow2={pow2}: scales differ"
        assert conformance_layer._same_codes(q, want_q), f"pow2={pow2}: codes differ"


@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c.id for c in LINEAR_CASES])
def test_linear_conformance(case, emulator, mi300x):
    quantized, launched = emulator.quantize_launches, emulator.launches
    ok, detail = conformance_layer.run_linear_case(case, "cpu", mi300x.name)
    assert ok, f"{case.id}: {detail}"
    rows = case.shape[0] * (case.shape[1] if len(case.shape) == 3 else 1)
    calls = 2 * (rows > 0)  # linear, then the case's own quantize_activation + gemm it must match
    assert (emulator.quantize_launches, emulator.launches) == (quantized + calls, launched + calls)
