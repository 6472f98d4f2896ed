"""Which calls of ``grouped_gemm`` and ``grouped_gemm_masked`` go to a backend's native op and with what, on a
stand-in native op (CPU): an eager call with ``offs`` asks the op to check ``offs`` on the host unless a CUDA graph is
being captured; the op bodies a compiled graph calls never ask; ``m_indices`` go to the row-ids op (functional and
``out=``), whose declining runs the planner; an output dtype the op has no form for, or ``out`` with ``out_dtype``
never reach it; a declined call runs the planner, and any other error propagates."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from fp8gemm import runtime
from fp8gemm.native import NATIVE_MISS

SEED = 3


def operands(masked: bool):
    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    groups, rows, n, k = 3, 8, 32, 256
    x = torch.randn(groups * rows, k, generator=gen)
    a, a_scale = fp8gemm.quantize_activation(x)
    b, b_scale = zip(*(fp8gemm.quantize_weight(torch.randn(n, k, generator=gen)) for _ in range(groups)), strict=True)
    b, b_scale = torch.stack(b), torch.stack(b_scale)
    if masked:
        return a.view(groups, rows, k), b, a_scale.view(groups, rows, -1), b_scale, torch.tensor([8, 0, 5]).int()
    return a, b, a_scale, b_scale, torch.tensor([5, 5, 20]).int()


class StandIn:
    """Records each native call as (name, the flag before the output or its dtype) and answers as told."""

    def __init__(self, answer):
        self.calls, self.answer = [], answer

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args[-2]))
            return self.answer(name, args)

        return call


def declined(name, args):
    raise RuntimeError(NATIVE_MISS + "declined by the test")


@pytest.fixture
def stand_in(monkeypatch):
    def install(answer, capturing=False):
        native = StandIn(answer)
        monkeypatch.setattr(runtime, "native_ops", lambda t, other, requested: native)
        monkeypatch.setattr(runtime, "capturing", lambda: capturing)
        return native

    return install


@pytest.mark.parametrize("capturing", [False, True])
def test_an_eager_call_with_offs_asks_for_the_host_check_outside_capture(stand_in, capturing):
    a, b, a_scale, b_scale, offs = operands(masked=False)
    marker = torch.full((a.shape[0], b.shape[1]), 7.0)
    native = stand_in(lambda name, args: marker if name == "grouped_gemm" else None, capturing)
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs) is marker
    out = torch.empty_like(marker)
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=out) is out
    assert native.calls == [("grouped_gemm", not capturing), ("grouped_gemm_out", not capturing)]


def test_the_op_bodies_never_ask_for_the_host_check(stand_in):
    a, b, a_scale, b_scale, offs = operands(masked=False)
    marker = torch.full((a.shape[0], b.shape[1]), 7.0, dtype=torch.bfloat16)
    native = stand_in(lambda name, args: marker if name == "grouped_gemm" else None)
    ops = getattr(torch.ops, runtime.LIBRARY)
    assert torch.equal(ops.grouped_gemm(a, b, a_scale, b_scale, offs, None, torch.bfloat16, ""), marker)
    ops.grouped_gemm_out(a, b, a_scale, b_scale, offs, None, torch.empty_like(marker), "")
    assert native.calls == [("grouped_gemm", False), ("grouped_gemm_out", False)]


@pytest.mark.parametrize("masked", [False, True], ids=["offs", "masked"])
def test_a_declined_call_runs_the_planner_and_other_errors_propagate(stand_in, masked):
    args = operands(masked)
    call = fp8gemm.grouped_gemm_masked if masked else fp8gemm.grouped_gemm
    expected = call(*args)
    native = stand_in(declined)
    assert torch.equal(call(*args), expected) and len(native.calls) == 1

    def broken(name, args):
        raise RuntimeError("fp8gemm: torch could not allocate a tensor")

    stand_in(broken)
    with pytest.raises(RuntimeError, match="could not allocate"):
        call(*args)


def _m_indices() -> torch.Tensor:
    ids = torch.repeat_interleave(torch.arange(3), torch.tensor([5, 0, 15])).int()
    return torch.cat([ids, torch.full((4,), -1, dtype=torch.int32)])


def test_m_indices_go_to_the_row_ids_op_and_a_declined_call_runs_the_planner(stand_in):
    a, b, a_scale, b_scale, offs = operands(masked=False)
    m_indices = _m_indices()
    marker = torch.full((a.shape[0], b.shape[1]), 7.0)
    native = stand_in(lambda name, args: marker if name == "grouped_gemm_row_ids" else None)
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, m_indices=m_indices, out_dtype=torch.float32) is marker
    out = torch.empty_like(marker)
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, m_indices=m_indices, out=out) is out
    assert native.calls == [("grouped_gemm_row_ids", m_indices), ("grouped_gemm_row_ids_out", m_indices)]
    expected = fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs)  # the same rows (ids sorted, -1 past the groups)
    stand_in(declined)
    assert torch.equal(fp8gemm.grouped_gemm(a, b, a_scale, b_scale, m_indices=m_indices), expected)


def test_calls_the_native_op_has_no_form_for_never_reach_it(stand_in):
    a, b, a_scale, b_scale, offs = operands(masked=False)
    native = stand_in(declined)
    with pytest.raises((TypeError, ValueError)):
        fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out_dtype=torch.float16)
    out = torch.empty(a.shape[0], b.shape[1])
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=out, out_dtype=torch.float32) is out  # the planner's
    assert native.calls == []
    fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out_dtype=torch.float32)
    assert native.calls == [("grouped_gemm", True)]
