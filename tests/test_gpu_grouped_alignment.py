"""Grouped GEMMs on the GPU with strides a tensor map cannot take as they are, against the float64 oracle: one group
of an odd M_max with the quantizer's scales viewed as [1, M_max, K/128] (a group stride of M_max floats), then the
grouped conformance suite's STRIDE_CASES (M_max 1, 3, 7, 9, 63, 65 with one and six groups, masked_m 0, partial and
full; size-1 dims with odd strides; scales 4 bytes past a 16-byte boundary), through the native op and through the
Python planner, on every GPU backend with a grouped entry. Each must run, never stop at cuTensorMapEncodeTiled.

Skipped without a GPU; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_grouped_alignment.py
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import device_under_test, fp8_dtype_for, gpu_backends_with
from fp8gemm import runtime
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance_grouped
from fp8gemm.testing.conformance import DEFAULT_SEED, TOLERANCE, relative_error

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")

BACKENDS = gpu_backends_with("grouped_launch")
PATHS = ["native", "planner"]  # the backend's native op where it has one, or the Python planner alone
CASES = conformance_grouped.STRIDE_CASES
# One group, M_max = 7, masked_m = 5: N from 16 to 272, K from 128 to 384.
ONE_GROUP = [(16, 128), (48, 256), (144, 384), (272, 128), (128, 256), (256, 384), (80, 128)]


def _take_path(monkeypatch, path: str) -> None:
    if path == "planner":
        monkeypatch.setattr(runtime, "native_ops", lambda *args: None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("n", "k"), ONE_GROUP)
def test_one_group_of_seven_rows(monkeypatch, backend, path, n, k):
    """The quantizer's outputs viewed as one group of 7 rows, 5 of them real, prepared weight scales."""
    _take_path(monkeypatch, path)
    seed = DEFAULT_SEED + 7 * n + k
    print(f"data seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fp8 = fp8_dtype_for(torch.device("cuda"), backend)
    x, w = torch.randn(7, k, device="cuda", generator=gen), torch.randn(n, k, device="cuda", generator=gen)
    a, sa = fp8gemm.quantize_activation(x, fp8_dtype=fp8, backend=backend)
    b, bs = fp8gemm.quantize_weight(w, fp8_dtype=fp8)
    masked_m = torch.tensor([5], dtype=torch.int32, device="cuda")
    b_scale = fp8gemm.prepare_weight_scale(bs[None], backend=backend)
    out = fp8gemm.grouped_gemm_masked(a.view(1, 7, k), b[None], sa.view(1, 7, -1), b_scale, masked_m, backend=backend)
    torch.cuda.synchronize()
    assert out.shape == (1, 7, n) and out.dtype == torch.bfloat16
    want = oracle(a[:5], b, sa[:5], bs)
    err = relative_error(out[0, :5], want)
    assert err <= TOLERANCE[torch.bfloat16], f"rel. err {err:.3e} (data seed {seed})"
    assert (out[0, 5:] == 0).all(), "rows past masked_m must be zeros from the functional call"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stride_cases(monkeypatch, backend, path, case):
    _take_path(monkeypatch, path)
    result = conformance_grouped.run_case(case, "cuda", fp8_dtype_for(torch.device("cuda"), backend), backend)
    assert result.passed, f"{case.id} on {backend}: rel. err {result.rel_err:.3e} {result.detail}"


def test_there_is_a_grouped_backend():
    """A GPU run of this file checks a kernel, not the reference alone."""
    assert BACKENDS, "no installed backend on this GPU has a grouped entry"
