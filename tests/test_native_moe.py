"""The backends' native fused_experts and grouped GEMMs (fp8gemm/csrc/native_moe.cpp): the same bits as the
Python steps on the same entries, every other call handed to them, and the precise errors kept. GPU only, for every
backend under test built with its native ops library (as tests/test_native_ops.py)."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import device_under_test
from fp8gemm import moe_steps, registry
from fp8gemm.grouped_checks import conform_group_scale, plan_grouped
from fp8gemm.launch import run_grouped
from fp8gemm.moe import native_experts, run_fused_experts
from fp8gemm.native import NATIVE_MISS
from fp8gemm.protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED
from test_moe import MoeCase, make_case
from test_native_ops import NATIVE

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")

CASES = [
    MoeCase(1, 8, 1),
    MoeCase(1, 128, 8, hidden=2048, inter=768),  # decode at a Qwen3-30B-A3B-like shape (E, k), smaller H and I
    MoeCase(37, 8, 2, inter=256, routing="skewed"),
    MoeCase(6, 4, 3, routing="repeated"),
    MoeCase(20, 6, 2, routing="skipped"),
    MoeCase(300, 16, 4, hidden=512, routing="sparse"),
    MoeCase(19, 8, 2, routing="skewed", x_dtype=torch.float32),
    MoeCase(9, 4, 2, x_dtype=torch.float16, pow2=True, weight_dtype=torch.bfloat16),
]


def native_of(backend: str):
    return registry.select(device_under_test(), backend).backend.native


def fp8_of(backend: str):
    return getattr(torch, registry.select(device_under_test(), backend).backend.fp8_dtype)


def planned_experts(backend, args, pow2):
    return run_fused_experts(*args, "silu", pow2, None, backend)


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_fused_experts_gives_the_planned_steps_bits(backend, case, ids_dtype):
    x, ids, weights, w13, s13, w2, s2 = make_case(case, fp8_of(backend), device_under_test(), backend)
    ids = ids.to(ids_dtype)
    args = (x, ids, weights, w13, s13, w2, s2)
    got = native_of(backend).fused_experts(*args, case.pow2)
    planned = planned_experts(backend, args, case.pow2)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert torch.equal(got, planned)
    assert torch.equal(fp8gemm.fused_experts(*args, pow2_scales=case.pow2, backend=backend), planned)


@pytest.mark.parametrize("backend", NATIVE)
def test_fused_experts_off_the_native_path_is_planned(backend, monkeypatch):
    """Strided ids, column-major weight scales, no tokens, the torch steps: the public op gives the planned result,
    and the native op itself declines with its marker."""
    x, ids, weights, w13, s13, w2, s2 = make_case(MoeCase(12, 8, 2), fp8_of(backend), device_under_test(), backend)
    native, planned = native_of(backend), planned_experts(backend, (x, ids, weights, w13, s13, w2, s2), False)
    strided_ids = torch.stack([ids, ids], -1)[..., 0]
    column_major = s13.transpose(1, 2).contiguous().transpose(1, 2)
    for changed in ((x, strided_ids, weights, w13, s13, w2, s2), (x, ids, weights, w13, column_major, w2, s2),
                    (x[:0], ids[:0], weights[:0], w13, s13, w2, s2)):  # fmt: skip
        with pytest.raises(RuntimeError, match=NATIVE_MISS):
            native.fused_experts(*changed, False)
        got = fp8gemm.fused_experts(*changed, backend=backend)
        assert torch.equal(got, planned[: changed[0].shape[0]])
    monkeypatch.setattr(moe_steps, "USE_STEP_KERNELS", False)  # the torch steps: never the native op
    assert native_experts(x, w13, "silu", None, backend) is None
    assert fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend=backend).shape == x.shape


@pytest.mark.parametrize("backend", NATIVE)
def test_fused_experts_bad_inputs_keep_their_errors(backend):
    x, ids, weights, w13, s13, w2, s2 = make_case(MoeCase(4, 8, 2), fp8_of(backend), device_under_test(), backend)
    with pytest.raises(ValueError, match="topk_weights"):
        fp8gemm.fused_experts(x, ids, weights[:, :1], w13, s13, w2, s2, backend=backend)
    with pytest.raises(ValueError, match="w2"):
        fp8gemm.fused_experts(x, ids, weights, w13, s13, w2[:, :128], s2, backend=backend)
    with pytest.raises(ValueError, match="activation"):
        fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, activation="gelu", backend=backend)
    with pytest.raises(TypeError, match="topk_ids"):
        fp8gemm.fused_experts(x, ids.float(), weights, w13, s13, w2, s2, backend=backend)


def masked_case(groups, m_max, n, k, backend, seed):
    print(f"seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(groups * m_max, k, device="cuda", generator=gen).to(torch.bfloat16)
    a, a_scale = fp8gemm.quantize_activation(x, backend=backend)
    w = torch.randn(groups, n, k, device="cuda", generator=gen)
    quantized = [fp8gemm.quantize_weight(w[g]) for g in range(groups)]
    b = torch.stack([q for q, _ in quantized]).to(fp8_of(backend))
    b_scale = fp8gemm.prepare_weight_scale(torch.stack([s for _, s in quantized]), backend=backend)
    masked_m = torch.randint(0, m_max + 1, (groups,), device="cuda", generator=gen, dtype=torch.int32)
    return a.view(groups, m_max, k), b, a_scale.view(groups, m_max, -1), b_scale, masked_m


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("groups, m_max, n, k", [(1, 8, 256, 512), (4, 64, 384, 1024), (8, 128, 2048, 256)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_masked_grouped_gemm_gives_the_planned_paths_bits(backend, groups, m_max, n, k, out_dtype):
    a, b, a_scale, b_scale, masked_m = masked_case(groups, m_max, n, k, backend, groups * 31 + m_max + n + k)
    plan = plan_grouped(GROUPED_MASKED, a, b, a_scale, b_scale, masked_m, None, out_dtype, backend, eager=False)
    planned = run_grouped(plan, a, b, masked_m, None, m_max)
    got = native_of(backend).grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, m_max, out_dtype is torch.float32)
    assert got.dtype == out_dtype and torch.equal(got, planned)
    out = torch.full_like(planned, float("nan"))  # rows past masked_m keep what they held
    assert fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, expected_m=m_max, out=out,
                                       backend=backend) is out  # fmt: skip
    for g in range(groups):
        rows = int(masked_m[g])
        assert torch.equal(out[g, :rows], planned[g, :rows]) and out[g, rows:].isnan().all()
    assert torch.equal(fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, out_dtype=out_dtype,
                                                   backend=backend), planned)  # fmt: skip


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("groups", [1, 3])
def test_masked_grouped_gemm_of_one_row_per_group_takes_any_row_stride(backend, groups):
    """M_max = 1: the row stride torch reports for a dim of size 1 is never stepped over; the native op takes a and out
    with row stride 1 (one row of a transpose) and gives the planned path's bits for contiguous operands."""
    a, b, a_scale, b_scale, masked_m = masked_case(groups, 1, 256, 512, backend, 40 + groups)
    masked_m.fill_(1)
    layout = next(ib.backend for ib in registry.installed_backends() if ib.name == backend).a_scale_layout
    a_scale = conform_group_scale(a_scale, layout)[0]  # one row per group: group stride 1 is no layout a kernel reads
    planned = fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, backend=backend)
    odd_a = a.as_strided(a.shape, (a.stride(0), 1, 1))
    out = torch.full_like(planned, float("nan"))
    odd_out = out.as_strided(out.shape, (out.stride(0), 1, 1))
    native_of(backend).grouped_gemm_masked_out(odd_a, b, a_scale, b_scale, masked_m, 1, odd_out)  # no miss raised
    assert torch.equal(out, planned)


@pytest.mark.parametrize("backend", NATIVE)
def test_masked_grouped_gemm_off_the_native_path(backend):
    a, b, a_scale, b_scale, masked_m = masked_case(2, 16, 256, 512, backend, 7)
    planned = fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, backend=backend)
    with pytest.raises(RuntimeError, match=NATIVE_MISS):  # values on the host: the planner checks them
        native_of(backend).grouped_gemm_masked(a, b, a_scale, b_scale, masked_m.cpu(), 0, False)
    with pytest.raises(ValueError):
        fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m[:1], backend=backend)
    with pytest.raises((TypeError, ValueError)):
        fp8gemm.grouped_gemm_masked(a, b, a_scale, b_scale, masked_m, out_dtype=torch.float16, backend=backend)
    assert torch.equal(fp8gemm.grouped_gemm_masked(a, b, a_scale.contiguous(), b_scale, masked_m, backend=backend),
                       planned)  # fmt: skip


def contiguous_case(sizes, n, k, backend, seed):
    """a [M, K] with M = sum(sizes) + 5 (rows in no group past offs[-1]), b [G, N, K], offs the cumulative ends."""
    print(f"seed {seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    m = sum(sizes) + 5
    a, a_scale = fp8gemm.quantize_activation(torch.randn(m, k, device="cuda", generator=gen), backend=backend)
    w = torch.randn(len(sizes), n, k, device="cuda", generator=gen)
    quantized = [fp8gemm.quantize_weight(w[g]) for g in range(len(sizes))]
    b = torch.stack([q for q, _ in quantized]).to(fp8_of(backend))
    b_scale = fp8gemm.prepare_weight_scale(torch.stack([s for _, s in quantized]), backend=backend)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    return a, b, a_scale, b_scale, offs


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("sizes, n, k", [([7], 256, 512), ([0, 33, 1, 0, 130], 384, 1024), ([64] * 8, 2048, 256)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_contiguous_grouped_gemm_gives_the_planned_paths_bits(backend, sizes, n, k, out_dtype):
    a, b, a_scale, b_scale, offs = contiguous_case(sizes, n, k, backend, sum(sizes) + n + k)
    plan = plan_grouped(GROUPED_CONTIGUOUS, a, b, a_scale, b_scale, offs, None, out_dtype, backend, eager=False)
    planned = run_grouped(plan, a, b, offs, None)
    end = int(offs[-1])
    for check in (True, False):
        got = native_of(backend).grouped_gemm(a, b, a_scale, b_scale, offs, check, out_dtype is torch.float32)
        assert got.dtype == out_dtype and torch.equal(got, planned) and not got[end:].any()
    out = torch.full_like(planned, float("nan"))  # rows past offs[-1] keep what they held
    assert fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=out, backend=backend) is out
    assert torch.equal(out[:end], planned[:end]) and out[end:].isnan().all()
    assert torch.equal(fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out_dtype=out_dtype, backend=backend),
                       planned)  # fmt: skip


@pytest.mark.parametrize("backend", NATIVE)
def test_contiguous_grouped_gemm_refuses_bad_offs_and_declines_the_rest(backend):
    """offs read on the host (an eager call): values the kernel must not take go to the planner, which raises its
    error; offs on the host are the planner's, which names them."""
    a, b, a_scale, b_scale, offs = contiguous_case([3, 20, 9], 256, 512, backend, 11)
    native = native_of(backend)
    for bad in ([3, 2, 9], [-1, 20, 32], [3, 23, a.shape[0] + 1]):
        bad_offs = torch.tensor(bad, dtype=torch.int32, device="cuda")
        with pytest.raises(RuntimeError, match=NATIVE_MISS):
            native.grouped_gemm(a, b, a_scale, b_scale, bad_offs, True, False)
        with pytest.raises(ValueError, match="offs"):
            fp8gemm.grouped_gemm(a, b, a_scale, b_scale, bad_offs, backend=backend)
    with pytest.raises(RuntimeError, match=NATIVE_MISS):
        native.grouped_gemm(a, b, a_scale, b_scale, offs.cpu(), True, False)
    with pytest.raises(ValueError, match="device"):  # the planner names offs on another device than a
        fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs.cpu(), backend=backend)
    with pytest.raises(ValueError):
        fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs[:2], backend=backend)


@pytest.mark.parametrize("backend", NATIVE)
def test_contiguous_grouped_gemm_in_a_cuda_graph_reads_offs_on_the_device(backend):
    """Captured (no host read of offs), replayed with other group ends written into the same tensor."""
    a, b, a_scale, b_scale, offs = contiguous_case([5, 0, 40, 17], 256, 512, backend, 12)
    out = torch.full((a.shape[0], 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=out, backend=backend)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=out, backend=backend)
    offs.copy_(torch.tensor([0, 30, 31, 60], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    expected = fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, out=torch.full_like(out, float("nan")),
                                    backend=backend)  # fmt: skip
    assert torch.equal(out.nan_to_num(7.0), expected.nan_to_num(7.0))
