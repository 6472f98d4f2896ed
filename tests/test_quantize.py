"""Property tests for the quantizers and the reference (hypothesis draws shapes and data)."""

from __future__ import annotations

import fp8gemm
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance
from hypothesis import given, settings
from hypothesis import strategies as st

FP8 = st.sampled_from([torch.float8_e4m3fn, torch.float8_e4m3fnuz])
FINITE = st.floats(-1e4, 1e4, allow_nan=False, width=32)


def _matrix(rows, k_blocks):
    return hnp.arrays(np.float32, st.tuples(rows, k_blocks.map(lambda b: 128 * b)), elements=FINITE)


def _quantization_bound(x: torch.Tensor, scale_per_element: torch.Tensor) -> torch.Tensor:
    # e4m3: 3 mantissa bits -> half an ulp is 2^-4 relative; below the smallest normal the step is
    # absolute (2^-9 of the scale for e4m3fn, 2^-10 for fnuz), of which half is allowed.
    return x.abs() * 2.0**-4 + scale_per_element * 2.0**-9


@settings(max_examples=40, deadline=None)
@given(x=_matrix(st.integers(1, 9), st.integers(1, 3)), fp8=FP8, pow2=st.booleans())
def test_quantize_activation_round_trip(x, fp8, pow2):
    x = torch.from_numpy(x)
    q, scale = fp8gemm.quantize_activation(x, fp8_dtype=fp8, pow2_scales=pow2)
    assert q.dtype == fp8 and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == (x.shape[0], x.shape[1] // 128)
    assert (scale > 0).all()
    assert q.float().abs().max() <= torch.finfo(fp8).max
    if pow2:
        assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))
    per_element = scale.repeat_interleave(128, dim=1)
    assert ((fp8gemm.dequantize(q, scale) - x).abs() <= _quantization_bound(x, per_element)).all()


@settings(max_examples=30, deadline=None)
@given(w=_matrix(st.integers(1, 300).map(lambda n: n), st.integers(1, 3)), fp8=FP8)
def test_quantize_weight_round_trip(w, fp8):
    w = torch.from_numpy(w)
    q, scale = fp8gemm.quantize_weight(w, fp8_dtype=fp8)
    n, k = w.shape
    assert q.shape == (n, k) and scale.shape == (-(-n // 128), k // 128)
    per_element = scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)
    assert ((fp8gemm.dequantize(q, scale) - w).abs() <= _quantization_bound(w, per_element)).all()
    # Each block's largest magnitude maps to (nearly) the FP8 maximum: the scale uses the range.
    amax = w.abs().reshape(n, k // 128, 128).amax(-1)
    block_amax = torch.nn.functional.pad(amax, (0, 0, 0, -n % 128)).reshape(-1, 128, k // 128).amax(1)
    nonzero = block_amax > 1e-6
    expected = block_amax / torch.finfo(fp8).max
    assert torch.allclose(scale[nonzero], expected[nonzero], rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), n16=st.integers(1, 20), kb=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_reference_matches_float64_oracle(m, n16, kb, seed):
    case = conformance.Case(m, 16 * n16, 128 * kb)
    gen = torch.Generator().manual_seed(seed)
    a, b, a_scale, b_scale = conformance.make_inputs(case, torch.float8_e4m3fn, "cpu", gen)
    out = torch.full((m, 16 * n16), float("nan"), dtype=torch.float32)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend="reference")
    assert conformance.relative_error(out, oracle(a, b, a_scale, b_scale)) < 1e-5


def test_quantized_gemm_approximates_the_float_product():
    x, w = torch.randn(200, 1024), torch.randn(400, 1024)
    a, sa = fp8gemm.quantize_activation(x)
    b, sb = fp8gemm.quantize_weight(w)
    exact = x.double() @ w.double().t()
    err = (fp8gemm.gemm(a, b, sa, sb).double() - exact).norm() / exact.norm()
    assert err < 0.06  # e4m3 quantisation of both operands: a few percent


def test_zero_block_gets_a_finite_scale():
    x = torch.zeros(2, 256)
    x[1, 128:] = torch.randn(128)
    q, scale = fp8gemm.quantize_activation(x)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert torch.equal(fp8gemm.dequantize(q, scale)[0], torch.zeros(256))


@pytest.mark.parametrize(
    "fn, arg, error, match",
    [
        (fp8gemm.quantize_activation, torch.randn(4, 200), ValueError, "multiple of 128"),
        (fp8gemm.quantize_activation, torch.ones(4, 128, dtype=torch.int32), TypeError, "bfloat16/float16/float32"),
        (fp8gemm.quantize_weight, torch.randn(2, 4, 128), ValueError, "2-D"),
        (fp8gemm.quantize_weight, [[1.0]], TypeError, "torch.Tensor"),
    ],
)
def test_quantizer_rejects_bad_input(fn, arg, error, match):
    with pytest.raises(error, match=match):
        fn(arg)


def test_quantizer_rejects_non_e4m3_dtype():
    with pytest.raises(TypeError, match="fp8_dtype"):
        fp8gemm.quantize_activation(torch.randn(2, 128), fp8_dtype=torch.float8_e5m2)
