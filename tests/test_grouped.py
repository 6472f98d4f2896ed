"""The grouped ops: their conformance suite on every backend that runs here (reference included), torch.compile,
autograd refusal, no host synchronisation where none is allowed, and values only the device sees.

Arch packages run this file unchanged on their GPU: `FP8GEMM_TEST_DEVICE=cuda pytest tests`.
"""

from __future__ import annotations

import math
import types

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test, fp8_dtype_for
from fp8gemm import grouped_checks, launch, registry
from fp8gemm.grouped_reference import reference_grouped
from fp8gemm.protocol import GROUPED_MASKED
from fp8gemm.reference import REFERENCE, oracle
from fp8gemm.registry import Selection
from fp8gemm.testing import conformance, conformance_grouped
from fp8gemm.testing.conformance import DEFAULT_SEED, case_seed

BACKENDS = backends_under_test()
DEVICE = device_under_test()
CASES = conformance_grouped.cases(DEVICE, n_random=6)  # random splits from conformance.DEFAULT_SEED
BAD = conformance_grouped.BAD_INPUTS
ON_GPU = DEVICE.type == "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_numerics(case, backend, device):
    result = conformance_grouped.run_case(case, device, fp8_dtype_for(device, backend), backend)
    assert result.passed, f"{case.id} on {backend}: rel. err {result.rel_err:.3e} {result.detail}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_input_raises_clear_error(bad, backend, device):
    ok, detail = conformance_grouped.run_bad_input(bad, device, fp8_dtype_for(device, backend), backend)
    assert ok, f"expected {bad.error.__name__} mentioning {bad.match!r}; got {detail}"


def test_suite_covers_the_contract():
    """The fixed cases keep covering the edges, whatever random splits are drawn."""
    fixed = conformance_grouped.cases("cpu", n_random=0)
    contiguous = [c for c in fixed if c.layout == "offs"]
    assert any(0 in c.rows and len(c.rows) > 1 for c in contiguous)  # empty groups
    assert any(len(c.rows) == 1 for c in contiguous)  # one group
    assert any(sorted(c.rows)[-2:][0] == 0 and len(c.rows) > 1 for c in contiguous)  # every row in one group
    assert any(c.m % 128 and c.m > 128 for c in contiguous) and any(c.tail for c in contiguous)
    assert any(sum(c.rows) == 0 and c.tail for c in contiguous)  # no row written at all
    assert any(c.layout == "m_indices" and c.tail for c in fixed)  # -1 rows
    row_ids = [c for c in fixed if c.layout == "m_indices"]
    assert any(c.order == "sorted" and c.m > sum(c.rows) + c.tail for c in row_ids)  # DeepGEMM's -1 padding
    assert any(not c.order and len(c.rows) > 1 for c in row_ids)  # rows in a random order
    assert any(sum(c.rows) == 0 and c.tail for c in row_ids) and any(c.m == 1 for c in row_ids)
    assert any(c.m > 2 * 256 and not c.order for c in row_ids)  # more than one row per work-item of a workgroup
    every = [c for c in fixed if c.layout == "masked" and sorted(c.rows) == list(range(c.m_max + 1))]
    assert every and every[0].rows != tuple(sorted(every[0].rows))  # masked_m 0..M_max, not in order
    assert any(c.layout == "masked" and c.m_max > 128 for c in fixed)
    for flag in ("col_major_scales", "preallocated_out", "prepared"):
        assert {getattr(c, flag) for c in fixed} == {True, False}, flag
    assert {c.out_dtype for c in fixed} == {torch.bfloat16, torch.float32}
    assert {c.layout for c in fixed if not c.preallocated_out} == set(conformance_grouped.LAYOUTS)
    for m_max in conformance_grouped.ODD_M_MAX:  # one group and six, masked_m 0, partial and full
        masked = [c for c in fixed if c.layout == "masked" and c.m_max == m_max]
        assert {c.groups for c in masked} >= {1, 6}, m_max
        assert {0, m_max} | ({(m_max + 1) // 2} if m_max > 1 else set()) <= {c.rows[0] for c in masked if c.groups == 1}
    assert {c.strides for c in fixed} == set(conformance_grouped.STRIDES)
    assert {c.layout for c in fixed if c.strides == "size1" and c.groups == 1} == set(conformance_grouped.LAYOUTS)


def _broken(how: str):
    """The reference with one mistake a kernel could make."""

    def run(layout, a, b, a_scale, b_scale, group_rows, out):
        if how == "wrong-expert":
            b, b_scale = b.roll(1, 0), b_scale.roll(1, 0)
        if how == "writes-every-row":
            out.zero_()
        if how == "one-row-short" and layout == GROUPED_MASKED:
            group_rows = (group_rows - 1).clamp(min=0)
        reference_grouped(layout, a, b, a_scale, b_scale, group_rows, out)

    return run


@pytest.mark.parametrize("how", ["wrong-expert", "writes-every-row", "one-row-short"])
def test_the_suite_catches_a_wrong_result(monkeypatch, how):
    """The checks can fail: each mistake fails some case of the fixed set."""
    monkeypatch.setattr(launch, "reference_grouped", _broken(how))
    results = [conformance_grouped.run_case(c, "cpu", torch.float8_e4m3fn) for c in conformance_grouped.cases("cpu", 0)]
    failed = [r for r in results if not r.passed]
    assert failed, how
    assert all("data seed" in r.detail for r in failed)  # a failure says how to repeat it


def _operands(layout: str, device=DEVICE, seed: int = DEFAULT_SEED):
    case = conformance_grouped.GroupedCase(layout, (3, 0, 9, 4), 128, 256, tail=2, m_max=9)
    print(f"{case.id}: data seed {case_seed(case, seed)}")
    gen = torch.Generator(device=device).manual_seed(case_seed(case, seed))
    return case, conformance_grouped.make_inputs(case, torch.float8_e4m3fn, device, gen, "reference")


def _call(layout: str, backend: str = "reference"):
    """The public op for ``layout``, called as ``(a, b, a_scale, b_scale, group_rows, **keywords)``."""
    if layout == "masked":
        return lambda a, b, sa, sb, rows, **kw: fp8gemm.grouped_gemm_masked(
            a, b, sa, sb, rows, expected_m=4, backend=backend, **kw
        )
    key = "offs" if layout == "offs" else "m_indices"
    return lambda a, b, sa, sb, rows, **kw: fp8gemm.grouped_gemm(a, b, sa, sb, **{key: rows}, backend=backend, **kw)


@pytest.fixture
def fresh_dynamo():
    """Each test's lambdas share code objects: without a reset, torch.compile's recompile limit is reached."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("layout", conformance_grouped.LAYOUTS)
@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_traces_both_ops(layout, compiler, fresh_dynamo):
    case, (a, b, sa, sb, rows) = _operands(layout)
    eager = _call(layout)
    compiled = torch.compile(_call(layout), fullgraph=True, backend=compiler)
    with torch.no_grad():
        expected = eager(a, b, sa, sb, rows)
        assert torch.equal(compiled(a, b, sa, sb, rows), expected)
        out = torch.full_like(expected, math.nan, dtype=torch.float32)
        compiled(a, b, sa, sb, rows, out=out)
    written = expected.float() != 0
    assert torch.equal(out[written].bfloat16(), expected[written]) and bool(out[~written].isnan().all())


@pytest.mark.parametrize("layout", conformance_grouped.LAYOUTS)
def test_an_input_that_requires_grad_is_refused(layout, fresh_dynamo):
    _, (a, b, sa, sb, rows) = _operands(layout)
    name = "grouped_gemm_masked" if layout == "masked" else "grouped_gemm"
    message = rf"fp8gemm\.{name} has no backward, and a_scale requires grad.*torch\.no_grad"
    with pytest.raises(RuntimeError, match=message):
        _call(layout)(a, b, sa.clone().requires_grad_(), sb, rows)
    with pytest.raises(RuntimeError, match=message):
        torch.compile(_call(layout), fullgraph=True, backend="eager")(a, b, sa.clone().requires_grad_(), sb, rows)
    op = getattr(torch.ops.fp8gemm, name)
    extra = (4,) if layout == "masked" else ((None,) if layout == "offs" else ())
    args = (a, b, sa, sb.clone().requires_grad_(), *((None, rows) if layout == "m_indices" else (rows,)), *extra)
    with pytest.raises(RuntimeError, match=rf"fp8gemm\.{name} has no backward, and b_scale requires grad"):
        op(*args, torch.bfloat16, "reference")
    needs_grad = sa.clone().requires_grad_()
    with torch.inference_mode():
        assert not _call(layout)(a, b, needs_grad, sb, rows).requires_grad


class HostRead(AssertionError):
    pass


def refuse_host_reads(monkeypatch) -> None:
    """Every way Python code reads a tensor's values on the host raises."""

    def refuse(name):
        def read(self, *args, **kwargs):
            raise HostRead(f"Tensor.{name} read values on the host")

        return read

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


@pytest.mark.parametrize("functional", [True, False])
def test_the_masked_path_never_reads_values_on_the_host(monkeypatch, functional):
    """On meta tensors, which have no values: the masked path (checks, dispatch, reference) runs to the end with every
    host read refused, so nothing in it waits on the device. On a GPU: test_gpu_graphs_replay_new_group_sizes."""
    _, inputs = _operands("masked", device="cpu")
    a, b, sa, sb, masked_m = (t.to("meta") for t in inputs)
    monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(REFERENCE, "meta plays a GPU"))
    out = None if functional else torch.empty(4, 9, 128, dtype=torch.bfloat16, device="meta")
    with pytest.MonkeyPatch.context() as reads:
        refuse_host_reads(reads)
        result = fp8gemm.grouped_gemm_masked(a, b, sa, sb, masked_m, expected_m=3, out=out)
    assert result.shape == (4, 9, 128) and result.device.type == "meta"


def test_the_host_read_check_can_fail(monkeypatch):
    refuse_host_reads(monkeypatch)
    with pytest.raises(HostRead):
        grouped_checks.check_masked_m_values(torch.tensor([1, 2], dtype=torch.int32), 4)


def test_offs_values_are_read_only_where_no_synchronisation_results(monkeypatch):
    """offs on a GPU: read (one small copy) in an eager call outside capture; never in the op (torch.compile, graphs)
    or during capture. CPU values are always checked: reading them waits on nothing."""
    gpu_offs = types.SimpleNamespace(device=torch.device("cuda", 0))  # what host_can_read looks at
    monkeypatch.setattr(grouped_checks, "has_storage", lambda t: True)
    monkeypatch.setattr(grouped_checks.runtime, "capturing", lambda: False)
    assert grouped_checks.host_can_read(gpu_offs, eager=True)
    assert not grouped_checks.host_can_read(gpu_offs, eager=False)
    monkeypatch.setattr(grouped_checks.runtime, "capturing", lambda: True)
    assert not grouped_checks.host_can_read(gpu_offs, eager=True)
    monkeypatch.undo()
    assert grouped_checks.host_can_read(torch.ones(4, dtype=torch.int32), eager=False)


@pytest.mark.parametrize("layout", conformance_grouped.LAYOUTS)
def test_values_only_the_device_sees_stay_inside_the_tensors(monkeypatch, layout):
    """Rows past M, a decreasing offs, ids past G, masked_m past M_max: no error (the host does not look), and
    nothing is written outside out, a view of a larger NaN buffer."""
    case, (a, b, sa, sb, rows) = _operands(layout)
    monkeypatch.setattr(grouped_checks, "host_can_read", lambda t, eager: False)  # as for values on a GPU
    bad = {"offs": [3, 1, 40, 99], "m_indices": [7, -5, 2] + [0] * (case.m - 3), "masked": [12, -3, 9, 1000]}
    rows = torch.tensor(bad[layout], dtype=torch.int32, device=DEVICE)
    shape = (4, case.m_max, 128) if layout == "masked" else (case.m, 128)
    buffer = torch.full((shape[0] + 2, *shape[1:-1], 160), math.nan, dtype=torch.bfloat16, device=DEVICE)
    out = buffer[1 : 1 + shape[0], ..., 16:144]
    with torch.no_grad():
        for backend in BACKENDS:
            _call(layout, backend)(a, b, sa, sb, rows, out=out)
            kept = buffer.clone()
            kept[1 : 1 + shape[0], ..., 16:144] = math.nan
            assert bool(kept.isnan().all()), f"{backend} wrote outside out"


def test_quantized_3d_activations_view_as_the_masked_layout(device):
    """quantize_activation(x [G, M_max, K]) returns [G*M_max, K] and [G*M_max, K/128]; .view(G, M_max, -1) of each
    is a view, and equals quantizing each group alone."""
    gen = torch.Generator(device=device).manual_seed(DEFAULT_SEED)
    print(f"seed {DEFAULT_SEED}")
    x = torch.randn(3, 5, 256, generator=gen, device=device)
    q, scale = fp8gemm.quantize_activation(x)
    q3, scale3 = q.view(3, 5, -1), scale.view(3, 5, -1)
    assert q3.data_ptr() == q.data_ptr() and scale3.data_ptr() == scale.data_ptr()
    for g in range(3):
        q_g, scale_g = fp8gemm.quantize_activation(x[g])
        assert torch.equal(q3[g].float(), q_g.float()) and torch.equal(scale3[g], scale_g)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA or ROCm device")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", conformance_grouped.LAYOUTS)
def test_gpu_graphs_replay_new_group_sizes(layout, backend):
    """Captured once, replayed with other group sizes written into the same tensor: the graph reads them on the
    device. The masked path also runs with torch's synchronisation check set to error."""
    case, (a, b, sa, sb, rows) = _operands(layout)
    call = _call(layout, backend)
    out = torch.full((4, case.m_max, 128) if layout == "masked" else (case.m, 128), math.nan, device=DEVICE)
    with torch.no_grad():
        if layout == "masked":
            torch.cuda.set_sync_debug_mode("error")
            try:
                call(a, b, sa, sb, rows, out=out)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        call(a, b, sa, sb, rows, out=out)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call(a, b, sa, sb, rows, out=out)
        other = {"offs": [0, 6, 6, 18], "m_indices": [r % 4 for r in range(case.m)], "masked": [9, 0, 1, 5]}
        rows.copy_(torch.tensor(other[layout], dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        expected = call(a, b, sa, sb, rows, out=torch.full_like(out, math.nan))
    assert torch.equal(out.nan_to_num(7.0), expected.nan_to_num(7.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_call_gives_the_same_bits(backend, device):
    """Ten calls of each grouped op on mixture-of-experts sizes (empty, one-row and uneven groups) give the same
    bits, and the first is within the bf16 tolerance of the float64 oracle, group by group."""
    print(f"seed {DEFAULT_SEED}")
    gen = torch.Generator(device=device).manual_seed(DEFAULT_SEED)
    fp8, (n, k), calls = fp8_dtype_for(device, backend), ((4096, 7168) if ON_GPU else (256, 512)), 10 if ON_GPU else 3
    sizes = [900, 0, 13, 4000, 1, 64, 129, 2000] if ON_GPU else [90, 0, 13, 400, 1, 64, 129, 200]
    masked = [64, 0, 17, 1, 33, 64, 5, 48]
    g, m = len(sizes), sum(sizes)
    b = conformance.random_fp8(g * n, k, fp8, device, gen).view(g, n, k)
    sb = conformance.random_scales(g * n // 128, k // 128, device, gen).view(g, n // 128, k // 128)
    a, sa = conformance.random_fp8(m, k, fp8, device, gen), conformance.random_scales(m, k // 128, device, gen)
    a3 = conformance.random_fp8(g * 64, k, fp8, device, gen).view(g, 64, k)
    sa3 = conformance.random_scales(g * 64, k // 128, device, gen).view(g, 64, k // 128)
    offs = torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)
    masked_m = torch.tensor(masked, dtype=torch.int32, device=device)
    runs = {
        "contiguous": lambda: fp8gemm.grouped_gemm(a, b, sa, sb, offs, backend=backend),
        "masked": lambda: fp8gemm.grouped_gemm_masked(a3, b, sa3, sb, masked_m, backend=backend),
    }
    for name, call in runs.items():
        first = call()
        assert all(torch.equal(first.view(torch.int16), call().view(torch.int16)) for _ in range(calls - 1)), name
        starts = [0, *offs.tolist()[:-1]]
        for group in range(g):
            if name == "contiguous":
                rows, out, a_g, sa_g = slice(starts[group], offs[group].item()), first, a, sa
            else:
                rows, out, a_g, sa_g = slice(0, masked[group]), first[group], a3[group], sa3[group]
            if rows.stop > rows.start:
                expected = oracle(a_g[rows], b[group], sa_g[rows], sb[group])
                error = conformance.relative_error(out[rows], expected)
                assert error <= conformance.TOLERANCE[torch.bfloat16], (name, group, error)
