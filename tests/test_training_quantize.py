"""The training quantizers: each operand in FP8 with its transpose. The untransposed halves are exactly the inference
quantizers'; the transposed ones are checked against float64 block by block."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from fp8gemm.training import quantize_weight_with_transpose, quantize_with_transpose

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
TINY = torch.finfo(torch.float32).tiny


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def _data(seed: int, shape, dtype) -> torch.Tensor:
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * torch.rand(*shape[:-1], 1, generator=gen).mul(8).exp2()
    return x.to(dtype)


def _check_transposed(x2d: torch.Tensor, q_t, scale_t, pow2: bool) -> None:
    """Against float64: each 128-token block of each column of x has scale amax / 448 (rounded up to a power of two
    with pow2), its codes dequantize to within half an e4m3 step of x, and the pad columns are zero codes."""
    m, k = x2d.shape
    m_pad = -(-m // 128) * 128
    assert tuple(q_t.shape) == (k, m_pad) and tuple(scale_t.shape) == (k, m_pad // 128)
    assert q_t.dtype == torch.float8_e4m3fn and scale_t.dtype == torch.float32
    x_t = torch.zeros(k, m_pad, dtype=torch.float64)
    x_t[:, :m] = x2d.double().t()
    amax = x_t.abs().reshape(k, m_pad // 128, 128).amax(-1)
    want = (amax / FP8_MAX).clamp_min(TINY)
    if pow2:
        want = torch.exp2(torch.ceil(torch.log2(want)))
        assert torch.equal(scale_t.double(), want)
    else:
        assert torch.allclose(scale_t.double(), want, rtol=2**-23, atol=0)
    s = scale_t.double().repeat_interleave(128, dim=1)
    # e4m3 rounds to nearest: within 2^-4 relative (3 mantissa bits), or half its subnormal step 2^-9 times the scale
    bound = torch.maximum(x_t.abs() * 2**-4, s * 2**-10)
    assert ((q_t.double() * s - x_t).abs() <= bound).all()
    assert (_bits(q_t[:, m:]) == 0).all()


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 128), (127, 256), (128, 128), (200, 384), (2, 3, 256)], ids=str)
def test_quantize_with_transpose(shape, dtype, pow2):
    x = _data(sum(shape) + 3 * pow2, shape, dtype)
    got = quantize_with_transpose(x, pow2_scales=pow2)
    q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2)
    assert torch.equal(_bits(got.q), _bits(q)) and torch.equal(got.scale, scale)
    assert got.scale.stride() == scale.stride()
    _check_transposed(x.reshape(-1, shape[-1]), got.q_t, got.scale_t, pow2)


def test_transposed_half_equals_quantizing_the_transpose():
    """Where M is whole 128-token blocks, x^T's codes and scales are quantize_activation(x.T)'s."""
    x = _data(9, (256, 384), torch.bfloat16)
    got = quantize_with_transpose(x)
    q, scale = fp8gemm.quantize_activation(x.t().contiguous())
    assert torch.equal(_bits(got.q_t), _bits(q)) and torch.equal(got.scale_t, scale)


def test_no_tokens():
    got = quantize_with_transpose(torch.empty(0, 256, dtype=torch.bfloat16))
    assert tuple(got.q.shape) == (0, 256) and tuple(got.q_t.shape) == (256, 0) and tuple(got.scale_t.shape) == (256, 0)


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("n, k", [(256, 384), (144, 256), (16, 128)])
def test_quantize_weight_with_transpose(n, k, pow2):
    w = _data(n + k, (n, k), torch.float32)
    got = quantize_weight_with_transpose(w, pow2_scales=pow2)
    q, scale = fp8gemm.quantize_weight(w, pow2_scales=pow2)
    assert torch.equal(_bits(got.q), _bits(q)) and torch.equal(got.scale, scale)
    assert torch.equal(_bits(got.q_t), _bits(q).t()) and got.q_t.is_contiguous()
    assert torch.equal(got.scale_t, scale.t()) and tuple(got.scale_t.shape) == (k // 128, -(-n // 128))
    deq_t = got.q_t.double() * got.scale_t.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:, :n]
    assert (deq_t - w.double().t()).norm() / w.double().norm() < 0.05  # e4m3's relative step is 2^-3 at most
    if n % 128 == 0:  # whole blocks: W^T's quantization itself
        direct, direct_scale = fp8gemm.quantize_weight(w.t().contiguous(), pow2_scales=pow2)
        assert torch.equal(_bits(got.q_t), _bits(direct)) and torch.equal(got.scale_t, direct_scale)


def test_inputs_that_require_grad_or_bad_shapes_are_refused():
    x = _data(4, (8, 256), torch.float32).requires_grad_()
    with pytest.raises(RuntimeError, match=r"fp8gemm\.training\.quantize_with_transpose has no backward, and x"):
        quantize_with_transpose(x)
    with pytest.raises(RuntimeError, match=r"quantize_weight_with_transpose has no backward, and w requires grad"):
        quantize_weight_with_transpose(x)
    with pytest.raises(ValueError, match=r"x's last dim \(K = 100\) must be a positive multiple of 128"):
        quantize_with_transpose(torch.randn(4, 100))
    with pytest.raises(TypeError, match="x must be a bfloat16/float16/float32 tensor"):
        quantize_with_transpose(torch.zeros(4, 128, dtype=torch.int32))
