"""No op has a backward: in grad mode, an input that requires grad is refused at the call, eager and compiled, so
autograd is never handed a wrong gradient. Under torch.no_grad / torch.inference_mode the same calls run."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import device_under_test

SEED = 44
DEVICE = device_under_test()


def _operands():
    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(4, 256, generator=gen).bfloat16().to(DEVICE)
    w = (torch.randn(128, 256, generator=gen) / 16).to(DEVICE)
    bias = torch.randn(128, generator=gen).bfloat16().to(DEVICE)
    q, scale = fp8gemm.quantize_weight(w)
    return x, q, fp8gemm.prepare_weight_scale(scale), bias


def _calls():
    """(name, argument that requires grad, call) for every public entry point."""
    x, q, scale, bias = _operands()
    a, a_scale = fp8gemm.quantize_activation(x)
    w = torch.randn(128, 256, device=DEVICE)
    grad = {"x": x.requires_grad_(), "bias": bias.clone().requires_grad_(), "a_scale": a_scale.clone().requires_grad_()}
    layer = fp8gemm.nn.Fp8Linear(256, 128, device=DEVICE)
    offs = torch.tensor([4], dtype=torch.int32, device=DEVICE)  # one expert, every row; masked: 4 rows of 4
    return [
        ("linear", "x", lambda: fp8gemm.linear(grad["x"], q, scale)),
        ("linear", "bias", lambda: fp8gemm.linear(x.detach(), q, scale, grad["bias"])),
        ("quantize_activation", "x", lambda: fp8gemm.quantize_activation(grad["x"])),
        ("quantize_weight", "w", lambda: fp8gemm.quantize_weight(w.requires_grad_())),
        ("gemm", "a_scale", lambda: fp8gemm.gemm(a, q, grad["a_scale"], scale)),
        ("linear", "x", lambda: layer(grad["x"])),  # Fp8Linear.forward
        ("grouped_gemm", "a_scale", lambda: fp8gemm.grouped_gemm(a, q[None], grad["a_scale"], scale[None], offs)),
        (
            "grouped_gemm_masked",
            "a_scale",
            lambda: fp8gemm.grouped_gemm_masked(a[None], q[None], grad["a_scale"][None], scale[None], offs),
        ),
    ]


CALLS = [(op, name) for op, name, _ in _calls()]


@pytest.mark.parametrize("index", range(len(CALLS)), ids=[f"{op}-{name}" for op, name in CALLS])
def test_an_input_that_requires_grad_is_refused_with_the_fix(index):
    op, name, call = _calls()[index]
    with pytest.raises(RuntimeError, match=rf"fp8gemm\.{op} has no backward, and {name} requires grad.*torch\.no_grad"):
        call()


@pytest.mark.parametrize("index", range(len(CALLS)), ids=[f"{op}-{name}" for op, name in CALLS])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_the_same_calls_run_for_inference(index, mode):
    _, _, call = _calls()[index]
    with mode():
        result = call()
    outputs = result if isinstance(result, tuple) else (result,)
    assert all(not t.requires_grad for t in outputs)


def test_compiled_linear_refuses_as_eager_does():
    x, q, scale, bias = _operands()
    compiled = torch.compile(fp8gemm.linear, fullgraph=True, backend="eager")
    with pytest.raises(RuntimeError, match=r"fp8gemm\.linear has no backward, and x requires grad"):
        compiled(x.requires_grad_(), q, scale, bias)
    with torch.no_grad():
        assert torch.equal(compiled(x, q, scale, bias), fp8gemm.linear(x, q, scale, bias))


def test_the_ops_refuse_when_called_through_torch_ops():
    x, q, scale, bias = _operands()
    with pytest.raises(RuntimeError, match=r"fp8gemm\.linear has no backward, and weight_scale requires grad"):
        torch.ops.fp8gemm.linear(x, q, scale.clone().requires_grad_(), bias, False, "")
    with pytest.raises(RuntimeError, match=r"fp8gemm\.quantize_activation has no backward, and x requires grad"):
        torch.ops.fp8gemm.quantize_activation(x.requires_grad_(), None, False, "")


def test_a_model_run_without_no_grad_is_refused_not_differentiated():
    """The old failure: backward ran and gave a wrong x.grad. Now the forward stops with the fix."""
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 256), torch.nn.Linear(256, 128)).to(DEVICE, torch.bfloat16)
    fp8gemm.nn.convert(model, skip=())
    tokens = torch.arange(4, device=DEVICE)
    with pytest.raises(RuntimeError, match="torch.inference_mode"):
        model(tokens)  # the embedding's output requires grad
    with torch.inference_mode():
        assert model(tokens).shape == (4, 128)


def test_an_op_that_writes_out_bumps_its_version():
    """Autograd sees the write (a tensor saved for backward, then overwritten, is caught): on a GPU the kernel writes
    through a pointer, so the op's autograd kernel bumps the version."""
    x, q, scale, _ = _operands()
    a, a_scale = fp8gemm.quantize_activation(x)
    out = torch.empty(x.shape[0], q.shape[0], dtype=torch.bfloat16, device=DEVICE)
    before = out._version
    with torch.no_grad():
        torch.ops.fp8gemm.gemm_out(a, q, a_scale, scale, out, "")
    assert out._version > before
    assert torch.equal(out, fp8gemm.gemm(a, q, a_scale, scale))
