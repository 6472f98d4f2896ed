"""The grouped transposing quantizer's fused row sources (gather, SwiGLU, SwiGLU backward; the core's
fp8gemm/quantize_sources.cuh through each CUDA package's ``quantize_grouped_transposed`` entry) on the GPU, bit for bit
against the torch composition on the same device followed by the plain grouped quantizer (the reference's numerics:
tests/test_gpu_grouped_quantize.py checks that quantizer against it): one launch each, experts with 0, a partial and
more than 128 rows, rows past offs[-1], an index out of range, strided sources. The caching allocator is poisoned first.

Skipped without a GPU; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_grouped_sources.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import count_calls, device_under_test, gpu_backends_with
from fp8gemm import runtime
from fp8gemm.moe_torch import silu_and_mul
from fp8gemm.protocol import SOURCE_GATHER, SOURCE_SWIGLU, SOURCE_SWIGLU_BACKWARD
from fp8gemm.training import quantize_grouped_with_transpose
from fp8gemm.training.grouped_sources import (
    quantize_gathered_with_transpose,
    quantize_swiglu_backward_with_transpose,
    quantize_swiglu_with_transpose,
    swiglu_backward,
)
from test_gpu_grouped_quantize import _poison_allocator, _same

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")

BACKENDS = gpu_backends_with("quantize_grouped_transposed")
COUNTS = [130, 0, 5, 200, 1, 128]  # 0, partial, whole and > 128 rows
EXTRA = 37  # rows past offs[-1]


def _offs() -> torch.Tensor:
    return torch.tensor(COUNTS, device="cuda").cumsum(0).to(torch.int32)


def _rows() -> int:
    return sum(COUNTS) + EXTRA


@pytest.fixture
def launches(monkeypatch):
    return count_calls(monkeypatch, runtime, "call_quantize_grouped_transposed")


def _check(backend, fused, composed, launches) -> None:
    want = quantize_grouped_with_transpose(composed, _offs(), backend=backend)
    launches[0] = 0
    _poison_allocator(16 * composed.numel())
    got = fused(backend)
    assert launches[0] == 1, "the fused source ran as more than one launch (or not at all)"
    _same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gather_bits_equal_the_composition(backend, dtype, weighted, launches):
    seed = 7 + weighted + 2 * (dtype == torch.float32) + 4 * (dtype == torch.float16)
    print(f"seed {seed}: {dtype}, weighted {weighted}, {backend}")
    g = torch.Generator(device="cuda").manual_seed(seed)
    tokens, k = 300, 384
    wide = torch.randn(tokens, k + 128, generator=g, device="cuda").to(dtype)
    x = wide[:, :k]  # read in place at a wider row stride
    index = torch.randint(0, tokens, (_rows(),), generator=g, device="cuda")
    index[3] = tokens + 5  # outside [0, T): a zero row on the device
    weight = torch.rand(_rows(), generator=g, device="cuda") * 2 - 1 if weighted else None  # a zero row stays +0
    safe = index.clamp(max=tokens - 1)
    composed = x.index_select(0, safe)
    composed = composed if weight is None else torch.mul(composed, weight[:, None])
    composed[3] = 0
    _check(backend, lambda b: quantize_gathered_with_transpose(x, index, _offs(), row_weight=weight, backend=b),
           composed, launches)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_bits_equal_the_composition(backend, launches):
    g = torch.Generator(device="cuda").manual_seed(11)
    print(f"seed 11: {backend}")
    h = torch.randn(_rows(), 2 * 256, generator=g, device="cuda") * 3
    _check(backend, lambda b: quantize_swiglu_with_transpose(h, _offs(), backend=b), silu_and_mul(h, 256), launches)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_swiglu_backward_bits_equal_the_composition(backend, h_dtype, launches):
    seed = 13 + (h_dtype == torch.float32) + 2 * (h_dtype == torch.float16)
    print(f"seed {seed}: h {h_dtype}, {backend}")
    g = torch.Generator(device="cuda").manual_seed(seed)
    inter = 256
    h = (torch.randn(_rows(), 2 * inter, generator=g, device="cuda") * 3).to(h_dtype)
    d = torch.randn(_rows(), inter, generator=g, device="cuda")
    _check(backend, lambda b: quantize_swiglu_backward_with_transpose(d, h, _offs(), backend=b),
           swiglu_backward(d, h), launches)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_source_op_fake_implementation_gives_the_kernels_strides(backend):
    """torch.library.opcheck of the sources' op on the GPU, one call per source."""
    g = torch.Generator(device="cuda").manual_seed(17)
    print(f"seed 17: {backend}")
    rows, inter = _rows(), 256
    x = torch.randn(64, inter, generator=g, device="cuda").to(torch.bfloat16)
    index = torch.randint(0, 64, (rows,), generator=g, device="cuda")
    weight = torch.rand(rows, generator=g, device="cuda")
    h = torch.randn(rows, 2 * inter, generator=g, device="cuda")
    d = torch.randn(rows, inter, generator=g, device="cuda")
    calls = [(x, index, weight, None, SOURCE_GATHER, inter), (h, None, None, None, SOURCE_SWIGLU, inter),
             (d, None, None, h.bfloat16(), SOURCE_SWIGLU_BACKWARD, 2 * inter)]  # fmt: skip
    for source, index_, weight_, gate_up, kind, k in calls:
        args = (source, _offs(), index_, weight_, gate_up, kind, rows, k, None, False, backend)
        torch.library.opcheck(torch.ops.fp8gemm.quantize_grouped_source.default, args,
                              test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))  # fmt: skip
