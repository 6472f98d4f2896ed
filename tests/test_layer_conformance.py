"""Quantization and ``linear`` conformance on every backend that runs here (reference included)."""

from __future__ import annotations

import pytest
from conftest import backends_under_test
from fp8gemm.testing import conformance_layer as layer

BACKENDS = backends_under_test()
QUANT_CASES = layer.quant_cases()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", QUANT_CASES, ids=[c.id for c in QUANT_CASES])
def test_quantize_matches_reference_bit_for_bit(case, backend, device):
    ok, detail = layer.run_quant_case(case, device, backend)
    assert ok, f"{case.id} on {backend}: {detail}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", layer.LINEAR_CASES, ids=[c.id for c in layer.LINEAR_CASES])
def test_linear_against_float64(case, backend, device):
    ok, detail = layer.run_linear_case(case, device, backend)
    assert ok, f"{case.id} on {backend}: {detail}"
