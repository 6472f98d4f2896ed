"""The weight-gradient GEMM form: a per-row b_scale [N, K/128] (1x128 scales along K for both operands), float32
output, and ``accumulate=True``: its numerics and errors (here on the reference), and that the backends' fast paths
and a backend without the optional wgrad_launch entry never see it (tests/test_wgrad_routing.py: one with the entry)."""

from __future__ import annotations

import importlib

import fp8gemm
import pytest
import torch
from fp8gemm import ops, runtime
from fp8gemm.native import NATIVE_MISS
from fp8gemm.reference import oracle
from fp8gemm.testing.conformance import relative_error
from test_registry import H100, fake_gpu, fake_site  # noqa: F401 - fixtures

FP32_TOLERANCE = 5e-4  # the contract's, for float32 output


def _operands(seed: int, m: int, n: int, k: int):
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    a, a_scale = fp8gemm.quantize_activation(torch.randn(m, k, generator=gen) * 3)
    rows = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1)  # row magnitudes differ
    b, b_scale = fp8gemm.quantize_activation(rows)  # per row: [N, K/128]
    return a, b, a_scale, b_scale


def _float64_product(a, b, a_scale, b_scale) -> torch.Tensor:
    """Dequantise each operand element by element with its own 1x128 scale, then one float64 matmul."""
    sa = a_scale.double().repeat_interleave(128, dim=1)
    sb = b_scale.double().repeat_interleave(128, dim=1)
    return (a.double() * sa) @ (b.double() * sb).t()


@pytest.mark.parametrize("m, n, k", [(64, 48, 256), (1, 16, 128), (130, 272, 384)])
def test_per_row_b_scale_matches_float64(m, n, k):
    a, b, a_scale, b_scale = _operands(100 + m, m, n, k)
    assert tuple(b_scale.shape) == (n, k // 128)
    want = _float64_product(a, b, a_scale, b_scale)
    out = torch.full((m, n), float("nan"))
    assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out) is out
    assert relative_error(out, want) < FP32_TOLERANCE
    returned = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
    assert torch.equal(returned, out)


def test_per_row_scales_equal_to_a_blocks_give_the_block_forms_numbers():
    """Per-block scales repeated onto every row are the same numbers in the per-row form (N = 16: [1, K/128] is per
    block, [16, K/128] per row)."""
    a, b, a_scale, _ = _operands(7, 32, 16, 256)
    gen = torch.Generator().manual_seed(8)
    block = torch.rand(1, 2, generator=gen) + 0.5
    per_block = fp8gemm.gemm(a, b, a_scale, block, out_dtype=torch.float32)
    per_row = fp8gemm.gemm(a, b, a_scale, block.expand(16, 2).contiguous(), out_dtype=torch.float32)
    assert torch.equal(per_block, per_row)
    assert relative_error(per_row, _float64_product(a, b, a_scale, block.expand(16, 2))) < FP32_TOLERANCE


@pytest.mark.parametrize("form", ["per-row", "per-block"])
def test_accumulate_adds_the_product_into_out(form):
    a, b, a_scale, b_scale = _operands(21, 40, 144, 256)
    if form == "per-block":
        b, b_scale = fp8gemm.quantize_weight(b.float() * b_scale.repeat_interleave(128, dim=1))
    gen = torch.Generator().manual_seed(22)
    start = torch.randn(40, 144, generator=gen) * 50
    out = start.clone()
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True)
    want = start.double() + oracle(a, b, a_scale, b_scale)
    assert relative_error(out, want) < FP32_TOLERANCE
    assert relative_error(out - start, oracle(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    again = out.clone()
    fp8gemm.gemm(a, b, a_scale, b_scale, out=again, accumulate=True)
    assert relative_error(again, start.double() + 2 * oracle(a, b, a_scale, b_scale)) < FP32_TOLERANCE


ERRORS = [
    (
        "accumulate-without-out",
        dict(accumulate=True),
        ValueError,
        "accumulate=True adds the product into out, but no out",
    ),
    ("accumulate-bf16-out", dict(accumulate=True, out="bf16"), TypeError, "accumulate=True needs a torch.float32 out"),
    ("accumulate-out-shape", dict(accumulate=True, out="shape"), ValueError, r"out must be \[M, N\] = \[64, 48\]"),
    ("per-row-wrong-k", dict(out_dtype=torch.float32, b_scale="k"), ValueError, r"b_scale must be \[N, K/128\]"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument_and_the_fix(case):
    _, kwargs, error, message = case
    a, b, a_scale, b_scale = _operands(5, 64, 48, 256)
    kwargs = dict(kwargs)
    if kwargs.get("out") == "bf16":
        kwargs["out"] = torch.full((64, 48), float("nan"), dtype=torch.bfloat16)
    elif kwargs.get("out") == "shape":
        kwargs["out"] = torch.full((64, 32), float("nan"))
    if kwargs.pop("b_scale", None) == "k":
        b_scale = b_scale[:, :1]
    with pytest.raises(error, match=message):
        fp8gemm.gemm(a, b, a_scale, b_scale, **kwargs)


def test_compiled_per_row_and_accumulate_match_eager():
    a, b, a_scale, b_scale = _operands(31, 64, 48, 256)

    def step(a, b, a_scale, b_scale, out):
        product = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
        fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True)
        return product

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = torch.ones(64, 48)
    product = compiled(a, b, a_scale, b_scale, out)
    assert torch.equal(product, fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32))
    assert torch.equal(out, 1 + product)


def test_per_row_form_reaches_only_the_native_wgrad_op(fake_site, fake_gpu, monkeypatch):  # noqa: F811
    """On a (fake) GPU with a backend and native ops: the per-row form goes to the native weight-gradient op (declined
    here, as on an arch without one), never to the native GEMM, a fast plan or the backend's launch; the block form
    still reaches all three."""
    fake_gpu(H100)
    a, b, a_scale, b_scale = _operands(41, 64, 48, 256)
    block_b, block_scale = fp8gemm.quantize_weight(b.float())
    native_calls, fast_plans = [], []

    class Native:
        def gemm(self, *args):
            native_calls.append("gemm")
            raise RuntimeError(NATIVE_MISS + "declined by the test")

        gemm_out = gemm

        def wgrad(self, *args):
            native_calls.append("wgrad")
            raise RuntimeError(NATIVE_MISS + "declined by the test")

        wgrad_out = wgrad

    monkeypatch.setattr(runtime, "native_ops", lambda t, other, requested: Native())
    real_fast = ops.fast_gemm_plan
    monkeypatch.setattr(ops, "fast_gemm_plan", lambda *args: fast_plans.append(real_fast(*args)) or fast_plans[-1])
    launches = importlib.import_module("fake_backends").CALLS
    launches.clear()
    out = torch.full((64, 48), float("nan"))
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend="hopper")
    assert native_calls == ["wgrad"] and fast_plans == [None] and launches == []
    assert relative_error(out, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True, backend="hopper")
    # the accumulating native op (declined), then, with no wgrad_launch, the product (native op declined) and one add
    assert native_calls == ["wgrad"] * 3 and launches == []

    fp8gemm.gemm(a, block_b, a_scale, block_scale, out=out, backend="hopper")
    assert native_calls == ["wgrad"] * 3 + ["gemm"] and [call["name"] for call in launches] == ["hopper"]


def test_eager_accumulate_takes_the_native_wgrad_op_after_the_checks(fake_site, fake_gpu, monkeypatch):  # noqa: F811
    """gemm(..., accumulate=True) on per-row scales: the native weight-gradient op adds into out (its accumulate flag
    set) and the planner never runs; bad input still meets the Python checks first."""
    fake_gpu(H100)
    a, b, a_scale, b_scale = _operands(45, 64, 48, 256)
    calls = []

    class Native:
        def wgrad_out(self, a_, b_, a_scale_, b_scale_, out, accumulate):
            calls.append(accumulate)
            out.add_(1.0)

    monkeypatch.setattr(runtime, "native_ops", lambda t, other, requested: Native())
    monkeypatch.setattr(ops, "checked_gemm_plan", lambda *args, **kwargs: pytest.fail("the planner ran"))
    out = torch.zeros(64, 48)
    assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True, backend="hopper") is out
    assert calls == [True] and torch.equal(out, torch.ones(64, 48))
    with pytest.raises(ValueError, match="out"):
        fp8gemm.gemm(a, b, a_scale, b_scale, out=torch.zeros(64, 40), accumulate=True, backend="hopper")
    assert calls == [True]


@pytest.mark.parametrize("out_given", [False, True], ids=["returned", "out="])
def test_per_row_form_in_bf16_is_the_float32_product_rounded_once(out_given):
    """A bf16 weight's gradient straight from the GEMM: bit for bit the float32 result cast to bf16."""
    a, b, a_scale, b_scale = _operands(97, 200, 144, 384)
    want = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32).bfloat16()
    if out_given:
        out = torch.full((200, 144), float("nan"), dtype=torch.bfloat16)
        assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out) is out
    else:
        out = fp8gemm.gemm(a, b, a_scale, b_scale)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_the_compiled_ops_bodies_take_the_native_ops_first(fake_site, fake_gpu, monkeypatch):  # noqa: F811
    """torch.ops.fp8gemm.gemm / gemm_out / quantize_activation, what a compiled graph calls, run the native op as an
    eager call does (its result returned as is), so compiled code pays one C++ call, not the Python planner."""
    fake_gpu(H100)
    a, b, a_scale, b_scale = _operands(43, 64, 48, 256)
    block_b, block_scale = fp8gemm.quantize_weight(b.float())
    marker = torch.full((64, 48), 7.0)
    calls = []

    class Native:
        def gemm(self, *args):
            calls.append("gemm")
            return marker

        def gemm_out(self, *args):
            calls.append("gemm_out")

        def quantize_activation(self, x, pow2):
            calls.append("quantize_activation")
            return marker, marker

    monkeypatch.setattr(runtime, "native_ops", lambda t, other, requested: Native())
    lib = getattr(torch.ops, runtime.LIBRARY)
    assert lib.gemm(a, block_b, a_scale, block_scale, torch.bfloat16, "hopper") is marker
    out = torch.empty(64, 48, dtype=torch.bfloat16)
    lib.gemm_out(a, block_b, a_scale, block_scale, out, "hopper")
    assert lib.quantize_activation(torch.randn(4, 256), None, False, "hopper")[0] is marker
    assert calls == ["gemm", "gemm_out", "quantize_activation"]
