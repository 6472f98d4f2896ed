"""The grouped quantizer's row sources on the reference path (the CPU): each of ``quantize_gathered_with_transpose``,
``quantize_swiglu_with_transpose`` and ``quantize_swiglu_backward_with_transpose`` bit for bit
``quantize_grouped_with_transpose`` of its torch composition written out here (an index out of range a zero row);
the SwiGLU backward against float64 autograd; bad inputs name the argument; torch.compile traces the op. The kernels:
tests/test_gpu_grouped_sources.py (CUDA), tests/test_gfx942_emulation_grouped_sources.py (gfx942's emulation)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import (
    quantize_gathered_with_transpose,
    quantize_grouped_with_transpose,
    quantize_swiglu_backward_with_transpose,
    quantize_swiglu_with_transpose,
)
from fp8gemm.training.grouped_sources import swiglu_backward

COUNTS = [130, 0, 5, 200, 1]  # empty, partial, more than 128 rows
EXTRA = 20  # rows past offs[-1]


def _offs() -> torch.Tensor:
    return torch.tensor(COUNTS).cumsum(0).to(torch.int32)


def _gen(seed: int) -> torch.Generator:
    print(f"seed {DEFAULT_SEED + seed}")
    return torch.Generator().manual_seed(DEFAULT_SEED + seed)


def _same(got, want) -> None:
    for name, g, w in zip(("q", "scale", "q_t", "scale_t"), got, want, strict=True):
        assert torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                           w.view(torch.uint8) if w.element_size() == 1 else w), name  # fmt: skip


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gather_is_the_grouped_quantizer_of_the_gathered_rows(dtype, weighted):
    g = _gen(1 + weighted + 2 * (dtype == torch.float32))
    rows = sum(COUNTS) + EXTRA
    x = (torch.randn(90, 256, generator=g) * 3).to(dtype)
    index = torch.randint(0, 90, (rows,), generator=g)
    index[[4, 140]] = torch.tensor([90, -3])  # outside [0, T): zero rows
    weight = torch.rand(rows, generator=g) * 2 - 1 if weighted else None  # negative weights: a zero row stays +0
    gathered = x[index.clamp(0, 89)]
    want_rows = gathered if weight is None else gathered * weight[:, None]
    want_rows[[4, 140]] = 0
    got = quantize_gathered_with_transpose(x, index, _offs(), row_weight=weight)
    _same(got, quantize_grouped_with_transpose(want_rows, _offs()))


def test_swiglu_is_the_grouped_quantizer_of_silu_and_mul():
    g = _gen(5)
    h = torch.randn(sum(COUNTS) + EXTRA, 512, generator=g) * 3
    got = quantize_swiglu_with_transpose(h, _offs())
    _same(got, quantize_grouped_with_transpose(F.silu(h[:, :256]) * h[:, 256:], _offs()))


@pytest.mark.parametrize("h_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_swiglu_backward_is_the_grouped_quantizer_of_the_gradient(h_dtype):
    g = _gen(6 + (h_dtype == torch.float32))
    rows = sum(COUNTS) + EXTRA
    h = (torch.randn(rows, 256, generator=g) * 3).to(h_dtype)
    d = torch.randn(rows, 128, generator=g)
    got = quantize_swiglu_backward_with_transpose(d, h, _offs())
    _same(got, quantize_grouped_with_transpose(swiglu_backward(d, h), _offs()))
    h64 = h.double().requires_grad_()
    (F.silu(h64[:, :128]) * h64[:, 128:]).backward(d.double())
    assert relative_error(swiglu_backward(d, h), h64.grad) < 1e-6


def test_bad_inputs_name_the_argument():
    x, offs = torch.randn(8, 128), torch.tensor([4, 8], dtype=torch.int32)
    index = torch.arange(8)
    with pytest.raises(TypeError, match="index must be a 1-D torch.int64"):
        quantize_gathered_with_transpose(x, index.int(), offs)
    with pytest.raises(ValueError, match="row_weight must have index's shape"):
        quantize_gathered_with_transpose(x, index, offs, row_weight=torch.rand(7))
    with pytest.raises(TypeError, match="h must be float32"):
        quantize_swiglu_with_transpose(torch.randn(8, 256).bfloat16(), offs)
    with pytest.raises(ValueError, match="I a positive multiple of 128"):
        quantize_swiglu_with_transpose(torch.randn(8, 384), offs)
    with pytest.raises(ValueError, match=r"h must be \[M, 2I\] beside d"):
        quantize_swiglu_backward_with_transpose(torch.randn(8, 128), torch.randn(8, 384), offs)
    with pytest.raises(TypeError, match="d must be float32"):
        quantize_swiglu_backward_with_transpose(torch.randn(8, 128).bfloat16(), torch.randn(8, 256), offs)
    with pytest.raises(TypeError, match="offs must be an int32 tensor"):
        quantize_swiglu_with_transpose(torch.randn(8, 256), offs.long())
    with pytest.raises(ValueError, match="offs must be non-decreasing"):
        quantize_swiglu_with_transpose(torch.randn(8, 256), torch.tensor([6, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="h must be a torch.Tensor"):
        quantize_swiglu_with_transpose(None, offs)
    with pytest.raises(ValueError, match="positive multiple of 128"):
        quantize_swiglu_with_transpose(torch.randn(8, 0), offs)
    with pytest.raises(RuntimeError, match="quantize_swiglu_with_transpose has no backward, and h requires grad"):
        quantize_swiglu_with_transpose(torch.randn(8, 256, requires_grad=True), offs)
    with pytest.raises(
        RuntimeError, match="quantize_gathered_with_transpose has no backward, and row_weight requires grad"
    ):
        quantize_gathered_with_transpose(x, index, offs, row_weight=torch.rand(8, requires_grad=True))


def test_broadcast_rows_are_read_as_rows():
    g = _gen(8)
    row = torch.randn(1, 256, generator=g)
    index = torch.zeros(sum(COUNTS) + EXTRA, dtype=torch.int64)
    got = quantize_gathered_with_transpose(row.expand(90, 256), index, _offs())
    _same(got, quantize_grouped_with_transpose(row.expand(index.shape[0], 256).contiguous(), _offs()))


def test_compiled_sources_match_eager():
    g = _gen(9)
    rows = sum(COUNTS) + EXTRA
    h = torch.randn(rows, 256, generator=g)
    d = torch.randn(rows, 128, generator=g)
    fn = torch.compile(lambda d, h, offs: quantize_swiglu_backward_with_transpose(d, h, offs), fullgraph=True)
    torch._dynamo.reset()
    try:
        _same(fn(d, h, _offs()), quantize_swiglu_backward_with_transpose(d, h, _offs()))
    finally:
        torch._dynamo.reset()
