"""The backends' native ops (fp8gemm.native: the steady-state call as one C++ dispatcher op): the same bits as the
planned Python path, every other call handed to that path, and the precise errors kept.

GPU only, for every backend under test whose package was built with its native ops library (torch >= 2.10 in the
build environment); without a GPU the native path is never taken (tests/test_core_package.py checks the loader).
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test
from fp8gemm import registry
from fp8gemm.launch import run_gemm, run_linear, run_quantize
from fp8gemm.native import NATIVE_MISS
from fp8gemm.plans import checked_gemm_plan, checked_linear_plan, plan_quantize
from fp8gemm.reference import oracle, reference_quantize
from fp8gemm.testing import conformance

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")


def native_backends() -> list[str]:
    names = []
    for name in backends_under_test():
        if name != "reference" and registry.select(device_under_test(), name).backend.native is not None:
            names.append(name)
    return names


NATIVE = native_backends() if device_under_test().type != "cpu" else []
SHAPES = [(1, 4096, 7168), (7, 2112, 512), (64, 576, 1536), (300, 7168, 2048), (4096, 256, 384)]


def weight(n, k, seed, backend):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=gen)
    q, scale = fp8gemm.quantize_weight(w)
    return q, fp8gemm.prepare_weight_scale(scale, backend=backend)


def activations(shape, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=gen) * 3).to(dtype)


def test_every_gpu_backend_built_here_has_native_ops():
    """The GPU script builds with torch >= 2.10: a backend without its native ops is a broken build or loader."""
    if not NATIVE:
        pytest.skip("no backend under test was built with its native ops library")
    for name in NATIVE:
        info = registry.select(device_under_test(), name).backend.build_info
        assert info["native_ops"].startswith("yes"), info["native_ops"]


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_gives_the_planned_paths_bits(backend, m, n, k, dtype):
    seed = m * 7 + n + k
    print(f"seed {seed}")
    w, scale = weight(n, k, seed, backend)
    x = activations((m, k), dtype, seed + 1)
    native = registry.select(device_under_test(), backend).backend.native
    planned = run_linear(checked_linear_plan(x, w, scale, None, backend), x, w, None, False)
    if dtype is torch.bfloat16:
        got = native.linear(x, w, scale, False)
        assert got.dtype == dtype and got.shape == (m, n) and torch.equal(got, planned)
    else:  # through an fp32 GEMM: the Python planner's
        with pytest.raises(RuntimeError, match=NATIVE_MISS):
            native.linear(x, w, scale, False)
    got = fp8gemm.linear(x, w, scale, backend=backend)
    assert torch.equal(got, planned)
    q, sa = reference_quantize(x.float(), w.dtype, False)
    reference = oracle(q, w, sa, scale)
    assert conformance.relative_error(got.float(), reference) < 4e-3


@pytest.mark.parametrize("backend", NATIVE)
def test_linear_keeps_leading_dims_and_power_of_two_scales(backend):
    w, scale = weight(512, 1024, 5, backend)
    x = activations((3, 5, 1024), torch.bfloat16, 6)
    native = registry.select(device_under_test(), backend).backend.native
    for pow2 in (False, True):
        got = native.linear(x, w, scale, pow2)
        planned = run_linear(checked_linear_plan(x, w, scale, None, backend), x, w, None, pow2)
        assert got.shape == (3, 5, 512) and torch.equal(got, planned)


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm_gives_the_planned_paths_bits(backend, m, n, k, out_dtype):
    seed = m + 3 * n + k
    print(f"seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b, sa, sb = conformance.make_inputs(conformance.Case(m, n, k), torch.float8_e4m3fn, "cuda", gen)
    sa = fp8gemm.quantize_activation(activations((m, k), torch.bfloat16, seed), backend=backend)[1]
    b_scale = fp8gemm.prepare_weight_scale(sb, backend=backend)
    native = registry.select(device_under_test(), backend).backend.native
    got = native.gemm(a, b, sa, b_scale, out_dtype is torch.float32)
    planned = run_gemm(checked_gemm_plan(a, b, sa, b_scale, None, out_dtype, backend), a, b, None)
    assert torch.equal(got, planned)
    out = torch.full((m, n + 8), float("nan"), dtype=out_dtype, device="cuda")[:, :n]  # a row stride past n
    assert fp8gemm.gemm(a, b, sa, b_scale, out=out, backend=backend) is out
    assert torch.equal(out, planned)
    assert conformance.relative_error(got.float(), oracle(a, b, sa, sb)) < (
        4e-3 if out_dtype is torch.bfloat16 else 5e-4
    )


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("shape", [(1, 7168), (37, 512), (2, 9, 2048), (1000, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_activation_gives_the_planned_paths_bits_and_layout(backend, shape, dtype):
    x = activations(shape, dtype, sum(shape))
    native = registry.select(device_under_test(), backend).backend.native
    for pow2 in (False, True):
        q, scale = native.quantize_activation(x, pow2)
        q_ref, scale_ref = run_quantize(plan_quantize(x, None, backend), x, pow2)
        assert q.shape == q_ref.shape and scale.shape == scale_ref.shape and scale.stride() == scale_ref.stride()
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)


@pytest.mark.parametrize("backend", NATIVE)
def test_calls_off_the_native_path_are_planned_in_python(backend):
    """A column-major weight scale (converted per call), a bias, no rows, a strided 3-D x: the public ops give the
    planned path's result, and the native op itself declines with its marker."""
    native = registry.select(device_under_test(), backend).backend.native
    w, scale = weight(256, 512, 9, backend)
    x = activations((4, 512), torch.bfloat16, 10)
    column_major = scale.t().contiguous().t()
    with pytest.raises(RuntimeError, match=NATIVE_MISS):  # [2, 4]: column-major is not K-major
        native.linear(x, w, column_major, False)
    expected = run_linear(checked_linear_plan(x, w, scale, None, backend), x, w, None, False)
    assert torch.equal(fp8gemm.linear(x, w, column_major, backend=backend), expected)
    bias = activations((256,), torch.bfloat16, 11)
    assert torch.equal(fp8gemm.linear(x, w, scale, bias, backend=backend), expected + bias)
    assert fp8gemm.linear(x[:0], w, scale, backend=backend).shape == (0, 256)
    with pytest.raises(RuntimeError, match=NATIVE_MISS):
        native.linear(x[:0], w, scale, False)
    wide = activations((2, 4, 1024), torch.bfloat16, 12)[..., :512]  # rows strided: not readable in place
    with pytest.raises(RuntimeError, match=NATIVE_MISS):
        native.linear(wide, w, scale, False)
    assert torch.equal(fp8gemm.linear(wide, w, scale, backend=backend),
                       fp8gemm.linear(wide.contiguous(), w, scale, backend=backend))  # fmt: skip


@pytest.mark.parametrize("backend", NATIVE)
def test_bad_inputs_still_raise_the_precise_errors(backend):
    w, scale = weight(256, 512, 13, backend)
    x = activations((4, 512), torch.bfloat16, 14)
    with pytest.raises(TypeError, match="weight"):
        fp8gemm.linear(x, w.view(torch.uint8), scale, backend=backend)
    with pytest.raises(ValueError):
        fp8gemm.linear(activations((4, 384), torch.bfloat16, 15), w, scale, backend=backend)
    with pytest.raises((TypeError, ValueError)):
        fp8gemm.gemm(w[:4], w, scale, scale, out_dtype=torch.float16, backend=backend)
