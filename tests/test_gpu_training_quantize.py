"""The CUDA arch packages' transposing quantizer (the core's fp8gemm/quantize_tiles.cuh through each package's
``quantize_transposed`` entry) on the GPU, bit for bit against the reference on the same device: activations (M tails
of every residue, strided rows, bf16/fp16/fp32, the conformance suite's special values: zero, tie, NaN and infinite
blocks, power-of-two scales) and weights (N tails that are multiples of 16; one that is not runs the reference). The
caching allocator is poisoned with 0xff bytes before each launch, so a code or scale the kernel leaves unwritten shows.

Skipped without a GPU or without a backend that has the entry; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_training_quantize.py
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import count_calls, device_under_test, gpu_backends_with
from fp8gemm import registry, runtime
from fp8gemm.testing.conformance_layer import _same_codes, _same_scales, special_values
from fp8gemm.training import quantize as training_quantize
from fp8gemm.training import quantize_weight_with_transpose, quantize_with_transpose

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")


BACKENDS = gpu_backends_with("quantize_transposed")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture
def launches(monkeypatch):
    """How many times the kernel entry was called (so a reference fallback cannot pass as the kernel), through the
    protocol: the native ops are off here (tests/test_native_training.py holds them to these bits)."""
    monkeypatch.setattr(runtime, "native_ops", lambda *args: None)
    return count_calls(monkeypatch, runtime, "call_quantize_transposed")


def _poison_allocator(nbytes: int) -> None:
    """Leave freed blocks full of 0xff (NaN codes, NaN scales) for the next allocations to reuse."""
    for size in (nbytes, nbytes // 4, 1 << 20, 1 << 12):
        torch.full((max(size, 1),), 0xFF, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()


def _same(got, want) -> None:
    for field, g, w in zip(("q", "scale", "q_t", "scale_t"), got, want, strict=True):
        assert g.shape == w.shape, f"{field}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        same = _same_codes(g, w) if g.dtype != torch.float32 else _same_scales(g, w)
        assert same, f"{field} differs from the reference"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 15, 16, 127, 128, 129, 300, 1031])
def test_activation_bits_equal_the_reference(backend, m, dtype, pow2, launches):
    seed = 7 * m + DTYPES.index(dtype) + 100 * pow2
    print(f"seed {seed}: m {m}, {dtype}, pow2 {pow2}, {backend}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k = 640
    wide = torch.empty(m, k + 128, dtype=dtype, device="cuda")  # rows read in place at a stride wider than K
    wide[:, :k] = special_values(m, k, dtype, "cuda", gen)
    x = wide[:, :k]
    want = quantize_with_transpose(x, pow2_scales=pow2, backend="reference")
    _poison_allocator(8 * m * k)
    got = quantize_with_transpose(x, pow2_scales=pow2, backend=backend)
    assert launches[0] == 1
    _same(got, want)
    q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2, backend=backend)  # the inference quantizer's bits
    assert _same_codes(got.q, q) and _same_scales(got.scale, scale) and got.scale.stride() == scale.stride()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batched", [False, True], ids=["2d", "3d"])
def test_activation_gradients_with_leading_dims(backend, batched, launches):
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(2, 333, 256, device="cuda", generator=gen, dtype=torch.bfloat16)
    x = x if batched else x.reshape(-1, 256)
    _same(quantize_with_transpose(x, backend=backend), quantize_with_transpose(x, backend="reference"))
    assert launches[0] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n,k", [(16, 128), (128, 128), (272, 384), (1040, 256), (4096, 1024)])
def test_weight_bits_equal_quantize_weight(backend, n, k, dtype, pow2, launches, monkeypatch):
    seed = n + k + 3 * pow2 + DTYPES.index(dtype)
    print(f"seed {seed}: n {n}, k {k}, {dtype}, pow2 {pow2}, {backend}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = special_values(n, k, dtype, "cuda", gen)
    q, scale = fp8gemm.quantize_weight(w, pow2_scales=pow2)  # torch on the GPU
    want = (q, scale, q.t(), scale.t())
    _poison_allocator(4 * n * k)
    monkeypatch.setenv(registry.ENV_VAR, backend)
    got = quantize_weight_with_transpose(w, pow2_scales=pow2)
    assert launches[0] == 1
    _same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weight_whose_rows_are_not_a_multiple_of_16_runs_the_reference(backend, launches, monkeypatch):
    w = torch.randn(200, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    monkeypatch.setenv(registry.ENV_VAR, backend)
    got = quantize_weight_with_transpose(w)
    q, scale = fp8gemm.quantize_weight(w)
    assert launches[0] == 0
    _same(got, (q, scale, q.t(), scale.t()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_training_layer_is_unchanged_by_the_kernel(backend, monkeypatch, launches):
    """fp8gemm.training.linear's output and gradients with the kernel equal those with the reference quantizers."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    x = torch.randn(300, 256, device="cuda", generator=gen, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, 256, device="cuda", generator=gen, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(300, 384, device="cuda", generator=gen, dtype=torch.bfloat16)
    monkeypatch.setenv(registry.ENV_VAR, backend)
    results = []
    for use_kernel in (True, False):
        if not use_kernel:  # the same outputs, the reference writing them
            outputs = training_quantize._outputs
            monkeypatch.setattr(training_quantize, "_outputs", lambda *args, real=outputs: (real(*args)[0], None))
        x.grad = w.grad = None
        fp8gemm.training.linear(x, w).backward(dy)
        results.append((fp8gemm.training.linear(x.detach(), w.detach()), x.grad, w.grad))
    assert launches[0] == 3  # x and W in the forward, dY in the backward
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
