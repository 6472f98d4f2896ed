"""``fp8gemm.training.linear``: the forward is ``fp8gemm.linear``'s bits; the gradients are close to float64 autograd
of the unquantized math, and each backward GEMM is within the contract's tolerance of a float64 product of the same
FP8 operands. Gradient accumulation, activation checkpointing and torch.compile keep the eager numbers."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
import torch._inductor.config
import torch.nn.functional as F
from fp8gemm.testing.conformance import relative_error
from fp8gemm.training import linear, quantize_weight_with_transpose, quantize_with_transpose

GRAD_TOLERANCE = 0.05  # FP8 against the unquantized math: each e4m3 operand carries ~2-3% relative error
GEMM_TOLERANCE = {torch.bfloat16: 4e-3, torch.float32: 5e-4}  # the contract's, by output dtype


def _problem(seed, shape, n, x_dtype, w_dtype, bias=True):
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    k = shape[-1]
    x = (torch.randn(*shape, generator=gen) * 2).to(x_dtype).requires_grad_()
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(w_dtype).requires_grad_()
    b = torch.randn(n, generator=gen).to(w_dtype).requires_grad_() if bias else None
    dy = torch.randn(*shape[:-1], n, generator=gen).to(x_dtype)
    return x, w, b, dy


def _float64_grads(x, w, b, dy):
    leaves = [t.detach().double().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    F.linear(*leaves).backward(dy.double())
    return [t.grad for t in leaves]


def _dequantize(q, scale, rows_per_scale):
    """float64 q * scale, each scale covering ``rows_per_scale`` rows and 128 columns."""
    s = scale.double().repeat_interleave(rows_per_scale, dim=0)[: q.shape[0]].repeat_interleave(128, dim=1)
    return q.double() * s


CASES = [  # (shape of x, N, x dtype, weight dtype)
    ((200, 384), 256, torch.bfloat16, torch.float32),
    ((2, 70, 256), 128, torch.bfloat16, torch.bfloat16),
    ((128, 128), 384, torch.float32, torch.float32),
    ((3, 256), 128, torch.float16, torch.float32),
]
IDS = [f"{'x'.join(map(str, s))}-N{n}-{str(xd)[6:]}-{str(wd)[6:]}" for s, n, xd, wd in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_against_float64_and_each_gemm_within_the_contract(case):
    shape, n, x_dtype, w_dtype = case
    x, w, b, dy = _problem(30 + CASES.index(case), shape, n, x_dtype, w_dtype)
    y = linear(x, w, b)
    y.backward(dy)
    assert x.grad.dtype == x_dtype and w.grad.dtype == w_dtype and b.grad.dtype == w_dtype
    want = _float64_grads(x, w, b, dy)
    errors = [relative_error(got, ref) for got, ref in zip((x.grad, w.grad, b.grad), want, strict=True)]
    print(f"relative errors against float64 autograd: dX {errors[0]:.4f}, dW {errors[1]:.4f}, dbias {errors[2]:.2e}")
    assert max(errors) < GRAD_TOLERANCE
    assert errors[2] < 1e-2 if x_dtype != torch.float32 else errors[2] < 1e-6  # a sum of dY, no FP8 in it

    # each backward GEMM against a float64 product of the FP8 operands it was given
    k = shape[-1]
    dq = quantize_with_transpose(dy.reshape(-1, n))
    xq = quantize_with_transpose(x.detach().reshape(-1, k))
    wq = quantize_weight_with_transpose(w.detach())
    dx_want = _dequantize(dq.q, dq.scale, 1) @ _dequantize(wq.q_t, wq.scale_t, 128).t()
    dw_want = _dequantize(dq.q_t, dq.scale_t, 1) @ _dequantize(xq.q_t, xq.scale_t, 1).t()
    dx_err = relative_error(x.grad.reshape(-1, k), dx_want)
    dw_err = relative_error(w.grad, dw_want)
    print(f"backward GEMMs against float64 of their FP8 operands: dX {dx_err:.2e}, dW {dw_err:.2e}")
    assert dx_err < GEMM_TOLERANCE[torch.bfloat16 if x_dtype == torch.bfloat16 else torch.float32]
    assert dw_err < GEMM_TOLERANCE[torch.bfloat16 if w_dtype == torch.bfloat16 else torch.float32]


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_forward_has_fp8gemm_linears_bits(x_dtype, with_bias):
    x, w, b, _ = _problem(11, (2, 5, 256), 384, x_dtype, torch.float32, bias=with_bias)
    y = linear(x, w, b)
    with torch.no_grad():
        q, scale = fp8gemm.quantize_weight(w)
        want = fp8gemm.linear(x, q, scale, b)
        assert torch.equal(y, want) and y.dtype == x_dtype and y.shape == (2, 5, 384)
        assert torch.equal(linear(x, w, b), want)  # without grad: the inference call itself


def test_saves_fp8_operands_not_the_high_precision_input():
    x, w, b, _ = _problem(12, (256, 256), 128, torch.bfloat16, torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        linear(x, w, b)
    assert sorted(str(t.dtype) for t in saved) == ["torch.float32"] * 2 + ["torch.float8_e4m3fn"] * 2
    assert {tuple(t.shape) for t in saved} == {(256, 256), (256, 2), (256, 128), (2, 1)}


def test_gradient_accumulation_sums_two_backward_passes():
    x, w, b, dy = _problem(13, (130, 256), 256, torch.bfloat16, torch.float32)
    dy2 = torch.randn(dy.shape, generator=torch.Generator().manual_seed(14)).bfloat16()
    singles = []
    for grad in (dy, dy2):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        linear(*leaves).backward(grad)
        singles.append([t.grad for t in leaves])
    linear(x, w, b).backward(dy)
    linear(x, w, b).backward(dy2)
    for got, one, two in zip((x.grad, w.grad, b.grad), *singles, strict=True):
        assert torch.equal(got, one + two)
    want = _float64_grads(x, w, b, dy + dy2)  # linear in dY: the sum's gradient
    errors = [relative_error(got, ref) for got, ref in zip((x.grad, w.grad, b.grad), want, strict=True)]
    print(f"accumulated gradients against float64: {errors}")
    assert max(errors) < GRAD_TOLERANCE


def _mlp(x, w1, w2):
    return linear(F.gelu(linear(x, w1)), w2)


def test_activation_checkpointing_gives_the_same_gradients():
    x, w1, _, _ = _problem(15, (160, 256), 384, torch.bfloat16, torch.float32, bias=False)
    w2 = (torch.randn(256, 384, generator=torch.Generator().manual_seed(16)) / 20).requires_grad_()
    _mlp(x, w1, w2).square().sum().backward()
    plain = [t.grad.clone() for t in (x, w1, w2)]
    for t in (x, w1, w2):
        t.grad = None
    torch.utils.checkpoint.checkpoint(_mlp, x, w1, w2, use_reentrant=False).square().sum().backward()
    for got, want in zip((x.grad, w1.grad, w2.grad), plain, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_forward_and_backward_match_eager(backend):
    """fullgraph: the autograd.Function, the ops' fake implementations and the torch quantizer trace, forward and
    backward. aot_eager keeps the eager bits. Inductor rounds where eager rounds (emulate_precision_casts: else it
    fuses gelu's bf16 output into the x^T quantizer in fp32), but its generated code may still round a division or
    fuse a multiply-add differently (torch 2.11 does): a few FP8 codes one step apart, so within 1% of eager."""
    x, w1, _, _ = _problem(17, (2, 100, 256), 384, torch.bfloat16, torch.float32, bias=False)
    w2 = (torch.randn(256, 384, generator=torch.Generator().manual_seed(18)) / 20).requires_grad_()
    y = _mlp(x, w1, w2)
    y.square().sum().backward()
    eager = [y.detach(), *(t.grad.clone() for t in (x, w1, w2))]
    for t in (x, w1, w2):
        t.grad = None
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        y = torch.compile(_mlp, fullgraph=True, backend=backend)(x, w1, w2)
        y.square().sum().backward()
    for got, want in zip([y.detach(), x.grad, w1.grad, w2.grad], eager, strict=True):
        if backend == "aot_eager":
            assert torch.equal(got, want)
        else:
            assert relative_error(got.float(), want.float()) < 1e-2


@pytest.mark.parametrize("frozen", ["weight", "x"])
def test_only_the_gradients_asked_for_are_computed(frozen):
    """A frozen weight (adapters) or an input that needs no gradient (the first layer): the other gradients are
    those of the full backward, bit for bit."""
    x, w, b, dy = _problem(21, (130, 256), 128, torch.bfloat16, torch.float32)
    linear(x, w, b).backward(dy)
    full = {"x": x.grad, "weight": w.grad, "bias": b.grad}
    x, w, b = (t.detach().requires_grad_(name != frozen) for name, t in (("x", x), ("weight", w), ("bias", b)))
    linear(x, w, b).backward(dy)
    for name, t in (("x", x), ("weight", w), ("bias", b)):
        assert t.grad is None if name == frozen else torch.equal(t.grad, full[name])


def test_no_tokens_gives_zero_weight_gradient():
    x, w, b, _ = _problem(19, (0, 256), 128, torch.bfloat16, torch.float32)
    y = linear(x, w, b)
    y.sum().backward()
    assert y.shape == (0, 128) and torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros(128))


ERRORS = [
    ("n-not-128", (16, 256), (144, 256), ValueError, r"out_features \(N = 144\) must be a positive multiple of 128"),
    ("k-not-128", (16, 144), (128, 144), ValueError, r"in_features \(K = 144\) must be a positive multiple of 128"),
    ("k-mismatch", (16, 256), (128, 384), ValueError, "x's last dim must equal weight's in_features"),
    ("fp8-weight", (16, 256), "fp8", TypeError, "weight must be the high-precision master weight"),
    ("int-x", "int", (128, 256), TypeError, "x must be a bfloat16/float16/float32 tensor"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument_and_the_fix(case):
    _, x_shape, w_shape, error, message = case
    x = torch.zeros(4, 256, dtype=torch.int32) if x_shape == "int" else torch.randn(*x_shape).requires_grad_()
    w = fp8gemm.quantize_weight(torch.randn(128, 256))[0] if w_shape == "fp8" else torch.randn(*w_shape)
    with pytest.raises(error, match=message):
        linear(x, w.requires_grad_() if w.is_floating_point() and w.dtype.itemsize > 1 else w)


def test_inference_ops_still_refuse_inputs_that_require_grad():
    x, w, b, _ = _problem(20, (4, 256), 128, torch.bfloat16, torch.float32)
    q, scale = fp8gemm.quantize_weight(w.detach())
    with pytest.raises(RuntimeError, match=r"fp8gemm\.linear has no backward, and x requires grad"):
        fp8gemm.linear(x, q, scale)
