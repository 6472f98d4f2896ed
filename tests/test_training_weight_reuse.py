"""``fp8gemm.training.reuse_quantized_weights()``: inside the block each master weight is quantized once, and the
micro-batches of a gradient-accumulation step get the bits they get without it; a weight changed in place, or another
tensor, is quantized again; the copies go when the block ends. On ``device_under_test()`` (the GPU where there is
one: the dense forward then leaves the native op for the Python path's pieces)."""

from __future__ import annotations

import gc
import importlib

import pytest
import torch
from conftest import device_under_test
from fp8gemm.training import fused_experts, linear, reuse_quantized_weights

linear_module = importlib.import_module("fp8gemm.training.linear")
experts_module = importlib.import_module("fp8gemm.training.experts")
weight_reuse = importlib.import_module("fp8gemm.training.weight_reuse")


def _count(monkeypatch, module, name) -> list:
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _dense(seed: int, w_dtype=torch.float32):
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    dev = device_under_test()
    xs = [(torch.randn(100 + 28 * i, 256, generator=gen) * 2).bfloat16().to(dev) for i in range(3)]
    dys = [torch.randn(x.shape[0], 384, generator=gen).bfloat16().to(dev) for x in xs]
    w = (torch.randn(384, 256, generator=gen) / 16).to(w_dtype).to(dev).requires_grad_()
    return xs, dys, w


def _accumulate(xs, dys, w):
    """The micro-batches' outputs and input gradients, and w's accumulated gradient; outputs poisoned first."""
    w.grad = None
    outs, dxs = [], []
    for x, dy in zip(xs, dys, strict=True):
        xg = x.clone().requires_grad_()
        y = linear(xg, w)
        y.backward(dy)
        outs.append(y.detach())
        dxs.append(xg.grad)
    return outs, dxs, w.grad.clone()


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_linear_micro_batches_quantize_the_weight_once_and_keep_their_bits(monkeypatch, w_dtype):
    xs, dys, w = _dense(61, w_dtype)
    want = _accumulate(xs, dys, w)
    calls = _count(monkeypatch, linear_module, "quantize_weight_with_transpose")
    with reuse_quantized_weights():
        got = _accumulate(xs, dys, w)
    assert len(calls) == 1
    for a, b in zip(want[0] + want[1] + [want[2]], got[0] + got[1] + [got[2]], strict=True):
        assert torch.equal(a, b)


def test_a_weight_changed_in_place_or_replaced_is_quantized_again(monkeypatch):
    xs, dys, w = _dense(62)
    calls = _count(monkeypatch, linear_module, "quantize_weight_with_transpose")
    with reuse_quantized_weights():
        linear(xs[0], w.detach().requires_grad_(False)).sum()  # no grad: the inference path, nothing kept
        first = linear(xs[0].requires_grad_(), w)
        with torch.no_grad():
            w.mul_(1.5)  # an optimizer step inside the block: the version counter moves
        second = linear(xs[0], w)
        other = w.detach().clone().requires_grad_()
        third = linear(xs[0], other)
        with reuse_quantized_weights():  # nested: the outer block's copies
            fourth = linear(xs[0], other)
    assert len(calls) == 3
    assert not torch.equal(first, second) and torch.equal(second, third) and torch.equal(third, fourth)
    # after the block: quantized afresh (on a GPU by the native op, which has its own quantizer call), the same bits
    assert weight_reuse._BLOCK.get() is None and torch.equal(second, linear(xs[0], w))


@pytest.mark.parametrize("fused", [False, True])
def test_a_torch_optimizer_step_inside_the_block_drops_the_copies(monkeypatch, fused):
    xs, dys, w = _dense(65)
    optimizer = torch.optim.AdamW([w], lr=0.1, fused=fused)  # fused: the version counter does not move
    calls = _count(monkeypatch, linear_module, "quantize_weight_with_transpose")
    with reuse_quantized_weights():
        linear(xs[0], w).backward(dys[0])
        optimizer.step()
        after_step = linear(xs[0], w)
    assert len(calls) == 2 and torch.equal(after_step, linear(xs[0], w))


def test_weights_computed_in_the_forward_are_quantized_every_call_and_copies_go_with_their_weight():
    xs, _, w = _dense(66)
    with reuse_quantized_weights():
        # a non-leaf weight: new on every call, never kept (on a GPU the native op quantizes it)
        assert not weight_reuse.reusing(w * 1.0) and weight_reuse.reusing(w)
        linear(xs[0], w * 1.0)
        linear(xs[0], w * 1.0)
        assert len(weight_reuse._BLOCK.get()) == 0
        other = w.detach().clone().requires_grad_()
        linear(xs[0], other)
        assert len(weight_reuse._BLOCK.get()) == 1
        del other
        gc.collect()
        assert len(weight_reuse._BLOCK.get()) == 0


def test_experts_micro_batches_quantize_each_weight_once_and_keep_their_bits(monkeypatch):
    print("seed 63")
    gen = torch.Generator().manual_seed(63)
    dev = device_under_test()
    t, e, h, i, k = 40, 4, 256, 128, 2
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / 16).to(dev).requires_grad_()
    w2 = (torch.randn(e, h, i, generator=gen) / 16).to(dev).requires_grad_()
    batches = []
    for _ in range(2):
        x = (torch.randn(t, h, generator=gen) * 2).bfloat16().to(dev)
        weights, ids = torch.randn(t, e, generator=gen).softmax(-1).topk(k)
        batches.append((x, ids.to(dev), weights.to(dev), torch.randn(t, h, generator=gen).bfloat16().to(dev)))

    def step():
        w13.grad = w2.grad = None
        outs = []
        for x, ids, weights, dout in batches:
            out = fused_experts(x, ids, weights, w13, w2)
            out.backward(dout)
            outs.append(out.detach())
        return outs + [w13.grad.clone(), w2.grad.clone()]

    want = step()
    calls = _count(monkeypatch, experts_module, "quantize_experts_with_transpose")
    with reuse_quantized_weights():
        got = step()
    assert len(calls) == 2  # w13 and w2, once each for both micro-batches
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_compiled_code_inside_the_block_quantizes_on_every_call_and_matches_eager():
    xs, dys, w = _dense(64)
    compiled = torch.compile(linear, fullgraph=True)
    with reuse_quantized_weights():
        want = linear(xs[0], w)
        got = compiled(xs[0], w)
        with torch.no_grad():
            w.add_(0.25)
        got_after = compiled(xs[0], w)
    assert torch.equal(want, got) and torch.equal(got_after, linear(xs[0], w))
