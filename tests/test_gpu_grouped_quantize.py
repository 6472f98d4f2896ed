"""The CUDA arch packages' grouped transposing quantizer (the core's fp8gemm/quantize_grouped_tiles.cuh through each
package's ``quantize_grouped_transposed`` entry) on the GPU, bit for bit against the reference on the same device: the
expert count patterns of tests/test_training_grouped_quantize.py, every split of two experts, bf16/fp16/fp32 with the
conformance suite's special values and power-of-two scales, rows past offs[-1], strided rows, and offs the host never
checks (out of order, negative, past M) through the entry directly. The caching allocator is poisoned with 0xff bytes
before each launch, so a code or scale the kernel leaves unwritten shows.

Skipped without a GPU or without a backend that has the entry; on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_grouped_quantize.py
"""

from __future__ import annotations

import fp8gemm
import pytest
import test_training_grouped_quantize
import torch
from conftest import count_calls, device_under_test, gpu_backends_with
from fp8gemm import registry, runtime
from fp8gemm.testing.conformance_layer import _same_codes, _same_scales, special_values
from fp8gemm.training import grouped_quantize, quantize_grouped_with_transpose

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")


BACKENDS = gpu_backends_with("quantize_grouped_transposed")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
COUNTS = test_training_grouped_quantize.COUNTS


@pytest.fixture
def launches(monkeypatch):
    """How many times the kernel entry was called, so a reference fallback cannot pass as the kernel."""
    return count_calls(monkeypatch, runtime, "call_quantize_grouped_transposed")


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


def _rows(counts, k=256, extra=0, dtype=torch.bfloat16, seed=0):
    x, offs = test_training_grouped_quantize._rows(counts, k=k, extra=extra, dtype=dtype, seed=seed)
    return x.cuda(), offs.cuda()


def _check(backend, x, offs, launches, pow2=False):
    want = quantize_grouped_with_transpose(x, offs, pow2_scales=pow2, backend="reference")
    _poison_allocator(8 * x.numel())
    got = quantize_grouped_with_transpose(x, offs, pow2_scales=pow2, backend=backend)
    assert launches[0] == (1 if x.shape[0] else 0)
    launches[0] = 0
    _same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("counts", COUNTS, ids=["-".join(map(str, c)) for c in COUNTS])
def test_expert_counts_bits_equal_the_reference(backend, counts, launches):
    x, offs = _rows(counts, seed=len(counts) + sum(counts))
    _check(backend, x, offs, launches)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_strided_rows_and_rows_of_no_expert(backend, dtype, pow2, launches):
    seed = 40 + DTYPES.index(dtype) + 10 * pow2
    print(f"seed {seed}: {dtype}, pow2 {pow2}, {backend}")
    counts, k = [130, 0, 5, 200, 1000], 640
    wide, offs = _rows(counts, k=k + 128, extra=70, dtype=dtype, seed=seed)
    x = wide[:, :k]  # rows read in place at a stride wider than K
    x[:] = special_values(x.shape[0], k, dtype, "cuda", torch.Generator(device="cuda").manual_seed(seed))
    _check(backend, x, offs, launches, pow2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_experts_than_a_block_searches_at_once(backend, launches):
    counts = [(e * 7) % 3 for e in range(600)]
    counts[260], counts[530] = 130, 300
    x, offs = _rows(counts, k=384, extra=5, seed=41)
    _check(backend, x, offs, launches)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_split_of_two_experts(backend, launches):
    x, _ = _rows([257], k=128, seed=4)
    for first in range(258):
        _check(backend, x, torch.tensor([first, 257], dtype=torch.int32, device="cuda"), launches)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ends", [[300, 100, 200], [-5, 50, 10_000], [2**31 - 1, -(2**31), 7]], ids=str)
def test_unchecked_offs_are_clamped_as_the_reference_clamps_them(backend, ends):
    x, _ = _rows([260], seed=31)
    offs = torch.tensor(ends, dtype=torch.int32, device="cuda")
    kernel = registry.select(torch.device("cuda"), backend).backend
    want = grouped_quantize._reference_grouped(x, offs, None, False, backend)
    _poison_allocator(8 * x.numel())
    got = grouped_quantize.kernel_grouped(kernel, x, offs, False)  # no host check of offs on this path
    _same(got, want)


# --- every expert's weight: the dense transposing kernel on a few experts at a time -----------------------------

TRANSPOSED_BACKENDS = gpu_backends_with("quantize_transposed")


@pytest.mark.parametrize("backend", TRANSPOSED_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_bytes", [1 << 30, 2 * 256 * 384], ids=["all-experts-at-once", "two-experts-at-a-time"])
def test_expert_weights_bits_equal_each_experts_quantize_weight(backend, dtype, chunk_bytes, monkeypatch):
    """quantize_experts_with_transpose through the dense kernel (N a multiple of 128) against the reference's
    quantize_weight of each expert on the same device, with special values in one expert."""
    monkeypatch.setattr(grouped_quantize, "EXPERTS_CHUNK_BYTES", chunk_bytes)
    seed = 60 + DTYPES.index(dtype)
    print(f"seed {seed}: {dtype}, {backend}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(5, 256, 384, device="cuda", generator=gen) * torch.rand(5, 1, 1, device="cuda", generator=gen)
    w = w.to(dtype)
    w[3] = special_values(256, 384, dtype, "cuda", gen)
    calls = count_calls(monkeypatch, runtime, "call_quantize_transposed")
    _poison_allocator(8 * w.numel())
    got = grouped_quantize.quantize_experts_with_transpose(w, backend=backend)
    assert calls[0] == (1 if chunk_bytes > 5 * 256 * 384 else 3)
    fp8 = got.q.dtype
    for e in range(5):
        q, scale = fp8gemm.quantize_weight(w[e], fp8_dtype=fp8)
        assert _same_codes(got.q[e], q) and _same_scales(got.scale[e], scale), f"expert {e}"
        assert _same_codes(got.q_t[e], q.t()) and _same_scales(got.scale_t[e], scale.t()), f"expert {e}"
