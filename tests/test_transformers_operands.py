"""fp8gemm.hf's matmul functions check a weight and convert its scale once (fp8gemm/hf/operands.py), not per call:
kept until the weight or its scale changes (a new tensor, new memory, an in-place write of a converted scale), never
kept when made during a CUDA-graph capture or from a tensor without a version counter, forgotten with the weight;
and the kept operands give the unkept call's result bit for bit."""

from __future__ import annotations

import gc

import fp8gemm
import pytest
import torch
from fp8gemm import hf
from fp8gemm.hf import finegrained_fp8, operands
from test_transformers_kernel import SEED, activations, fp8_weight

BLOCK = [128, 128]


@pytest.fixture
def checks(monkeypatch):
    """Counts the full checks (a kept weight skips them)."""
    calls = []
    full = finegrained_fp8.check_weight
    monkeypatch.setattr(finegrained_fp8, "check_weight", lambda *a: calls.append(1) or full(*a))
    return calls


def parameters(offset: int, ue8m0: bool = False):
    """transformers' FP8Linear parameters: FP8 weight and scale as nn.Parameters (which require grad)."""
    w, s = fp8_weight((272, 384), offset)
    if ue8m0:
        s = torch.exp2(torch.round(torch.log2(s))).to(torch.float8_e8m0fnu)
    return torch.nn.Parameter(w), torch.nn.Parameter(s, requires_grad=not ue8m0)


def direct(x, w, s) -> torch.Tensor:
    return fp8gemm.linear(x, w.detach(), s.detach().float())


def test_a_weight_is_checked_once_and_gives_the_direct_result(checks):
    print(f"data seed {SEED} (FP8GEMM_TEST_SEED)")
    w, s = parameters(1)
    x = activations((5, 384), 2)
    with torch.no_grad():
        first = hf.matmul_2d(x, w, s, BLOCK)
        kept = operands.kept_operands(w, s, (2, BLOCK))
        assert kept[0].data_ptr() == w.data_ptr() and kept[1].data_ptr() == s.data_ptr()  # no copies
        assert torch.equal(hf.matmul_2d(x, w, s, BLOCK), first) and len(checks) == 1
        again = hf.matmul_2d(x, w, s, (128, 128))  # another block_size: checked again, then kept
        assert torch.equal(hf.matmul_2d(x, w, s, (128, 128)), again) and len(checks) == 2
    assert torch.equal(first, direct(x, w, s)) and torch.equal(again, first)


def test_changes_are_seen(checks):
    w, s = parameters(3)
    x = activations((5, 384), 4)
    with torch.no_grad():
        hf.matmul_2d(x, w, s, BLOCK)
        s.mul_(2)  # fp32 scales are read in place: the write is read, nothing to check again
        assert torch.equal(hf.matmul_2d(x, w, s, BLOCK), direct(x, w, s))
        w.data = fp8_weight((272, 384), 5)[0]  # the same Parameter on new memory
        assert torch.equal(hf.matmul_2d(x, w, s, BLOCK), direct(x, w, s))
        with pytest.raises(NotImplementedError, match="another block size"):  # a kept weight is no pass
            hf.matmul_2d(x, w, s, [64, 64])
        other = torch.nn.Parameter(s.detach().clone() * 4)
        assert torch.equal(hf.matmul_2d(x, w, other, BLOCK), direct(x, w, other))
    assert len(checks) == 4


def test_ue8m0_scales_are_converted_once_and_again_after_a_write(checks):
    w, s = parameters(6, ue8m0=True)
    x = activations((5, 384), 7)
    with torch.no_grad():
        first = hf.matmul_2d(x, w, s, BLOCK)
        fp32 = operands.kept_operands(w, s, (2, BLOCK))[1]
        assert fp32.dtype == torch.float32 and hf.matmul_2d(x, w, s, BLOCK) is not None and len(checks) == 1
        s.copy_((s.float() * 2).to(torch.float8_e8m0fnu))  # a new checkpoint loaded in place
        second = hf.matmul_2d(x, w, s, BLOCK)
    assert len(checks) == 2 and torch.equal(first, direct(x, w, s.float() / 2)) and torch.equal(second, direct(x, w, s))


def test_copies_made_under_capture_or_without_versions_are_not_kept(monkeypatch):
    w, s = parameters(8, ue8m0=True)
    x = activations((5, 384), 9)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the tests' CPU tensors play the GPU's
    monkeypatch.setattr(operands.runtime, "capturing", lambda: True)
    with torch.no_grad():
        hf.matmul_2d(x, w, s, BLOCK)
        assert operands.kept_operands(w, s, (2, BLOCK)) is None
        fp32 = torch.nn.Parameter(s.detach().float())
        hf.matmul_2d(x, w, fp32, BLOCK)  # read in place: nothing to run later, kept
        assert operands.kept_operands(w, fp32, (2, BLOCK)) is not None
    monkeypatch.undo()
    with torch.inference_mode():
        w2, s2 = (t.detach().clone() for t in parameters(10, ue8m0=True))  # inference tensors: no version counter
        assert torch.equal(hf.matmul_2d(x, w2, s2, BLOCK), direct(x, w2, s2))
        assert operands.kept_operands(w2, s2, (2, BLOCK)) is None


def test_a_freed_weight_is_forgotten_and_a_refresh_forgets_all():
    w, s = parameters(11)
    x = activations((5, 384), 12)
    with torch.no_grad():
        hf.matmul_2d(x, w, s, BLOCK)
        key = id(w)
        assert key in operands._kept
        del w
        gc.collect()
        assert key not in operands._kept
        w, s = parameters(13)
        hf.matmul_2d(x, w, s, BLOCK)
        fp8gemm.registry.clear_caches()
        assert not operands._kept


def test_grouped_and_batched_keep_their_operands_too(checks):
    w, s = (torch.nn.Parameter(t) for t in fp8_weight((4, 256, 256), 14))
    x = activations((9, 256), 15)
    ids = torch.tensor([0, 3, 1, 1, 2, 0, 3, 3, 2])
    with torch.no_grad():
        first = hf.matmul_batched(x, w, s, block_size=BLOCK, expert_ids=ids)
        assert torch.equal(hf.matmul_batched(x, w, s, block_size=BLOCK, expert_ids=ids), first) and len(checks) == 1
        with pytest.raises(ValueError, match="weight must be \\[N, K\\]"):  # kept as [E, N, K]; a 2-D call checks
            hf.matmul_2d(x, w, s, BLOCK)
        offsets = torch.tensor([2, 4, 6, 9], dtype=torch.int32)
        order = torch.argsort(ids, stable=True)
        assert torch.equal(hf.matmul_grouped(x[order], w, s, offsets=offsets, block_size=BLOCK), first[order])
