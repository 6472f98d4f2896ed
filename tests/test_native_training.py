"""The backends' native training ops (fp8gemm/csrc/native_training.cpp): the transposing quantizer and the
weight-gradient GEMM in one C++ call each, and fp8gemm.training.linear's forward and backward in one call each, with
the bits and the layouts of the planned Python path, and the calls they decline handed to that path.

GPU only, for every backend under test built with its native ops library.
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import device_under_test
from fp8gemm import registry, runtime
from fp8gemm.launch import run_wgrad
from fp8gemm.native import NATIVE_MISS
from fp8gemm.plans import checked_gemm_plan
from fp8gemm.training import quantize as training_quantize
from test_native_ops import NATIVE, activations

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")


def native_of(backend: str):
    return registry.select(device_under_test(), backend).backend.native


def planned_quantize(x, blocks: bool, backend: str):
    """The Python path's outputs: the same kernel launched through the protocol, outputs from its planner."""
    out, kernel = training_quantize._outputs(x, None, blocks, backend)
    assert kernel is not None
    runtime.call_quantize_transposed(kernel, runtime.kernel_rows(x.reshape(-1, x.shape[-1])), *out, False, blocks)
    return out


def same(native_out, planned_out) -> None:
    for got, want in zip(native_out, planned_out, strict=True):
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got,
                           want.view(torch.uint8) if want.element_size() == 1 else want)  # fmt: skip


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("shape", [(1, 256), (100, 512), (3, 37, 384), (4096, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_transposed_gives_the_planned_paths_bits_and_layouts(backend, shape, dtype):
    seed = sum(shape) + dtype.itemsize
    print(f"seed {seed}")
    x = activations(shape, dtype, seed)
    native = native_of(backend)
    if native.quantize_transposed is None or registry.select(x.device, backend).backend.quantize_transposed is None:
        pytest.skip("no transposing quantizer")
    same(native.quantize_transposed(x, False, False), planned_quantize(x, False, backend))
    if len(shape) == 2 and shape[0] % 16 == 0:
        same(native.quantize_transposed(x, False, True), planned_quantize(x, True, backend))
    # the public call takes the native op and returns the same
    same(fp8gemm.training.quantize_with_transpose(x, backend=backend), planned_quantize(x, False, backend))


def wgrad_operands(m_tokens: int, n: int, k: int, seed: int, backend: str):
    dy = activations((m_tokens, n), torch.bfloat16, seed)
    x = activations((m_tokens, k), torch.bfloat16, seed + 1)
    dq = fp8gemm.training.quantize_with_transpose(dy, backend=backend)
    xq = fp8gemm.training.quantize_with_transpose(x, backend=backend)
    return dq.q_t, xq.q_t, dq.scale_t, xq.scale_t


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("m_tokens, n, k", [(100, 256, 384), (4096, 512, 1024), (1000, 2176, 512)])
def test_wgrad_gives_the_planned_paths_bits(backend, m_tokens, n, k):
    seed = m_tokens + n + k
    print(f"seed {seed}")
    native = native_of(backend)
    if registry.select(device_under_test(), backend).backend.wgrad_launch is None:
        pytest.skip("no weight-gradient entry")
    a, b, a_scale, b_scale = wgrad_operands(m_tokens, n, k, seed, backend)
    for dtype in (torch.float32, torch.bfloat16):
        plan = checked_gemm_plan(a, b, a_scale, b_scale, None, dtype, backend)
        planned = run_wgrad(plan, a, b, None)
        assert torch.equal(native.wgrad(a, b, a_scale, b_scale, dtype is torch.float32), planned)
        out = torch.full_like(planned, float("nan"))
        assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend=backend) is out and torch.equal(out, planned)
    start = torch.randn(n, k, device=a.device)
    out = start.clone()
    native.wgrad_out(a, b, a_scale, b_scale, out, True)
    planned = run_wgrad(checked_gemm_plan(a, b, a_scale, b_scale, None, torch.float32, backend), a, b, start.clone(),
                        accumulate=True)  # fmt: skip
    assert torch.equal(out, planned)


def record_native_calls(monkeypatch) -> list[str]:
    """The native ops with each call's name recorded, in the returned list."""
    calls, real = [], runtime.native_ops

    class Recording:
        def __init__(self, ops):
            self.ops = ops

        def __getattr__(self, name):
            op = getattr(self.ops, name)
            return lambda *args: calls.append(name) or op(*args)

    monkeypatch.setattr(runtime, "native_ops", lambda *args: None if real(*args) is None else Recording(real(*args)))
    return calls


@pytest.mark.parametrize("backend", NATIVE)
def test_eager_accumulate_takes_the_native_op_with_the_planned_bits(backend, monkeypatch):
    """fp8gemm.gemm(..., accumulate=True) on the transposing quantizer's operands: one native call that adds into out,
    the bits of the planned accumulate."""
    if registry.select(device_under_test(), backend).backend.wgrad_launch is None:
        pytest.skip("no weight-gradient entry")
    a, b, a_scale, b_scale = wgrad_operands(1100, 384, 640, 31, backend)
    start = activations((384, 640), torch.float32, 32)
    calls = record_native_calls(monkeypatch)
    out = start.clone()
    assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True, backend=backend) is out
    assert calls == ["wgrad_out"]
    plan = checked_gemm_plan(a, b, a_scale, b_scale, None, torch.float32, backend)
    assert torch.equal(out, run_wgrad(plan, a, b, start.clone(), accumulate=True))


@pytest.mark.parametrize("backend", NATIVE)
def test_declined_training_calls_reach_the_planner(backend):
    native = native_of(backend)
    if registry.select(device_under_test(), backend).backend.wgrad_launch is None:
        pytest.skip("no weight-gradient entry")
    a, b, a_scale, b_scale = wgrad_operands(256, 256, 256, 7, backend)
    row_major = b_scale.contiguous()  # per-row scales in another layout: the planner conforms them
    with pytest.raises(RuntimeError, match=NATIVE_MISS):
        native.wgrad(a, b, a_scale, row_major, True)
    want = native.wgrad(a, b, a_scale, b_scale, True)
    assert torch.equal(fp8gemm.gemm(a, b, a_scale, row_major, out_dtype=torch.float32, backend=backend), want)
    with pytest.raises(RuntimeError, match=NATIVE_MISS):
        native.wgrad_out(a, b, a_scale, b_scale, torch.empty(256, 256, device=a.device, dtype=torch.bfloat16), True)


def layer_step(x, weight, bias, dy):
    """y and the gradients of one forward and backward of fp8gemm.training.linear."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    bias = None if bias is None else bias.detach().requires_grad_()
    y = fp8gemm.training.linear(x, weight, bias)
    y.backward(dy)
    return [y, x.grad, weight.grad] + ([] if bias is None else [bias.grad])


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("shape, n", [((100, 512), 384), ((3, 37, 256), 1024), ((2048, 1024), 256)])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_training_linear_native_gives_the_python_paths_bits(backend, shape, n, weight_dtype, with_bias, monkeypatch):
    if registry.select(device_under_test(), backend).backend.wgrad_launch is None:
        pytest.skip("no weight-gradient entry")
    monkeypatch.setenv("FP8GEMM_BACKEND", backend)
    seed = sum(shape) + n
    print(f"seed {seed}")
    x = activations(shape, torch.bfloat16, seed)
    weight = activations((n, shape[-1]), weight_dtype, seed + 1) / 30
    bias = activations((n,), torch.bfloat16, seed + 2) if with_bias else None
    dy = activations((*shape[:-1], n), torch.bfloat16, seed + 3)
    calls = record_native_calls(monkeypatch)
    got = layer_step(x, weight, bias, dy)
    assert calls == ["linear_forward", "linear_backward"]  # one C++ call each way
    monkeypatch.setattr(runtime, "native_ops", lambda *args: None)
    want = layer_step(x, weight, bias, dy)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
