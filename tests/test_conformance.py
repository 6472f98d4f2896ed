"""The conformance suite, parametrised over every backend that runs here (reference included).

Arch packages run this file unchanged on their GPU: `FP8GEMM_TEST_DEVICE=cuda pytest tests`.
"""

from __future__ import annotations

import pytest
from conftest import backends_under_test, device_under_test, fp8_dtype_for
from fp8gemm.testing import conformance

BACKENDS = backends_under_test()
CASES = conformance.cases(device_under_test(), n_random=6)  # random shapes from conformance.DEFAULT_SEED


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_numerics(case, backend, device):
    result = conformance.run_case(case, device, fp8_dtype_for(device, backend), backend)
    assert result.passed, f"{case.id} on {backend}: rel. err {result.rel_err:.3e} {result.detail}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", conformance.BAD_INPUTS, ids=[b.id for b in conformance.BAD_INPUTS])
def test_bad_input_raises_clear_error(bad, backend, device):
    ok, detail = conformance.run_bad_input(bad, device, fp8_dtype_for(device, backend), backend)
    assert ok, f"expected {bad.error.__name__} mentioning {bad.match!r}; got {detail}"


def test_suite_covers_the_contract():
    """The fixed shapes must keep covering the contract's edges, whatever random shapes are drawn."""
    shapes = conformance.FIXED_SHAPES
    assert any(m == 1 for m, _, _ in shapes)
    assert any(m % 64 and m > 128 for m, _, _ in shapes)
    assert any(n % 128 for _, n, _ in shapes)
    assert any((k // 128) % 2 == 1 for _, _, k in shapes)
    assert any(k == 2304 for _, _, k in shapes)  # cuBLASLt's wrong-answer K in torch 2.11
    assert all(n % 16 == 0 and k % 128 == 0 for _, n, k in shapes)
    variants = conformance.cases("cpu", n_random=0)
    assert {c.col_major_scales for c in variants} == {True, False}
    assert {c.strided for c in variants} == {True, False}
    assert {str(c.out_dtype) for c in variants} == {"torch.bfloat16", "torch.float32"}
    assert any(c.m == 0 for c in variants)


def test_oracle_catches_a_wrong_scale(device):
    """The check can fail: a scale applied to the wrong K block is far outside tolerance."""
    import torch
    from fp8gemm.reference import oracle

    case = conformance.Case(64, 256, 512)
    gen = torch.Generator(device=device).manual_seed(1)
    a, b, a_scale, b_scale = conformance.make_inputs(case, torch.float8_e4m3fn, device, gen)
    right = oracle(a, b, a_scale, b_scale)
    wrong = oracle(a, b, a_scale.roll(1, dims=1), b_scale)
    assert conformance.relative_error(wrong, right) > 100 * conformance.TOLERANCE[torch.bfloat16]
    poisoned = torch.full_like(right, float("nan"))
    assert conformance.relative_error(poisoned, right) == float("inf")
