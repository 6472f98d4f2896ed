"""GPU-only behaviour of every installed backend: CUDA-graph capture, streams, torch.compile, devices.

Skipped without a GPU (CI has none); on a machine with one, run with FP8GEMM_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test
from fp8gemm import runtime
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance
from sm90a_kernel_shapes import KERNEL_SHAPES
from test_moe import MoeCase, make_case

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")
GPU_BACKENDS = [b for b in backends_under_test() if b != "reference"]


def _inputs(m, n, k, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return conformance.make_inputs(conformance.Case(m, n, k), torch.float8_e4m3fn, "cuda", gen)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("m", [1, 64, 300])  # split-K and plain plans
def test_cuda_graph_capture_and_replay(backend, m):
    a, b, sa, sb = _inputs(m, 2112, 1024, seed=m)
    b_scale = fp8gemm.prepare_weight_scale(sb, backend=backend)
    out = torch.full((m, 2112), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8gemm.gemm(a, b, sa, b_scale, out=out, backend=backend)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8gemm.gemm(a, b, sa, b_scale, out=out, backend=backend)
    for seed in (10, 11):  # new data in the captured buffers, then replay
        a2, _, sa2, _ = _inputs(m, 2112, 1024, seed=seed)
        a.copy_(a2), sa.copy_(sa2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert conformance.relative_error(out, oracle(a, b, sa, sb)) < 4e-3


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_runs_on_the_current_stream(backend):
    a, b, sa, sb = _inputs(256, 4096, 2048, seed=3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fp8gemm.gemm(a, b, sa, sb, backend=backend)
        torch.cuda._sleep(1_000_000)  # keep the side stream busy: a default-stream launch would not wait
        copy = out.clone()  # ordered after the GEMM only if the GEMM ran on `side`
    side.synchronize()
    assert conformance.relative_error(copy, oracle(a, b, sa, sb)) < 4e-3


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_torch_compile_on_gpu(backend):
    a, b, sa, sb = _inputs(128, 1024, 512, seed=4)

    def layer(a, sa):
        return torch.relu(fp8gemm.gemm(a, b, sa, sb, backend=backend).float())

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(a, sa), layer(a, sa))


def test_kept_scratch_is_one_buffer_per_stream_and_none_under_capture():

    here, side = torch.cuda.current_stream(), torch.cuda.Stream()
    cuda = torch.device("cuda", torch.cuda.current_device())
    first = runtime.scratch(4096, cuda, here.cuda_stream)
    assert runtime.scratch(runtime.SCRATCH_KEPT_BYTES, cuda, here.cuda_stream) == first
    assert runtime.scratch(4096, cuda, side.cuda_stream) != first
    graph, kept = torch.cuda.CUDAGraph(), set(runtime.kept_scratch_addresses().values())
    with torch.cuda.graph(graph):  # a graph must own its scratch: kept buffers outlive no graph
        captured = runtime.scratch(4096, cuda, torch.cuda.current_stream().cuda_stream)
        torch.cuda._sleep(1)  # a graph with no work draws a warning
    assert captured not in kept


def test_scratch_from_a_private_pool_is_not_kept(monkeypatch):
    monkeypatch.setattr(runtime, "_kept_scratch", {})
    cuda, side, pool = torch.device("cuda", torch.cuda.current_device()), torch.cuda.Stream(), torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool), torch.cuda.stream(side):
        runtime.scratch(4096, cuda, side.cuda_stream)
    assert (cuda.index, side.cuda_stream) not in runtime.kept_scratch_addresses()
    runtime.scratch(4096, cuda, side.cuda_stream)  # the stream's first buffer decides: still none kept
    assert (cuda.index, side.cuda_stream) not in runtime.kept_scratch_addresses()
    here = torch.cuda.current_stream().cuda_stream
    runtime.scratch(4096, cuda, here)
    assert (cuda.index, here) in runtime.kept_scratch_addresses()


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_reduce_overhead_compile_warms_up_records_and_replays(backend):
    """torch.compile's CUDA-graph mode (transformers' generate compiles with it) warms up in a private pool, records,
    then replays: a layer step through all three gives eager's bits on new data each call."""
    torch._dynamo.reset()
    fp8 = fp8gemm.preferred_fp8_dtype("cuda", backend)
    x, ids, weights, w13, s13, w2, s2 = make_case(MoeCase(8, 8, 2, routing="skewed"), fp8, "cuda", backend)
    gen = torch.Generator(device="cuda").manual_seed(7)
    w, w_scale = fp8gemm.quantize_weight(torch.randn(256, 256, device="cuda", generator=gen) / 16, fp8_dtype=fp8)

    def step(x, ids, weights):
        h = fp8gemm.linear(x, w, w_scale, backend=backend)
        return fp8gemm.fused_experts(h, ids, weights, w13, s13, w2, s2, backend=backend)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    try:
        for call in range(4):
            x = torch.randn(x.shape, device="cuda", generator=gen).bfloat16()
            out = compiled(x, ids, weights).clone()
            assert torch.equal(out, step(x, ids, weights)), call
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_linear_and_gemm_on_several_streams_and_in_a_graph_between_eager_calls(backend):
    """Kept scratch and fresh scratch together: eager calls on two streams and graph replays, each checked
    bitwise against the fully checked path (quantize_activation, then gemm through the dispatcher)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    fp8 = fp8gemm.preferred_fp8_dtype("cuda", backend)
    w, w_scale = fp8gemm.quantize_weight(torch.randn(2112, 1024, device="cuda", generator=gen), fp8_dtype=fp8)

    def expected(x):
        q, s = fp8gemm.quantize_activation(x, fp8_dtype=fp8, backend=backend)
        return torch.ops.fp8gemm.gemm(q, w, s, w_scale, torch.bfloat16, backend)

    xs = [torch.randn(m, 1024, device="cuda", generator=gen).bfloat16() for m in (1, 3, 64, 1, 3, 64)]
    static_x = xs[0].clone()
    fp8gemm.linear(static_x, w, w_scale, backend=backend)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fp8gemm.linear(static_x, w, w_scale, backend=backend)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            eager = fp8gemm.linear(x, w, w_scale, backend=backend)
            q, s = fp8gemm.quantize_activation(x, fp8_dtype=fp8, backend=backend)
            eager_gemm = fp8gemm.gemm(q, w, s, w_scale, backend=backend)
        static_x.copy_(xs[3]), graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(eager, expected(x)) and torch.equal(eager_gemm, expected(x)), i
        assert torch.equal(static_y, expected(xs[3])), i


def test_auto_selection_on_this_gpu():
    chosen = fp8gemm.select("cuda").backend.name
    installed = {ib.name for ib in fp8gemm.installed_backends() if ib.backend}
    if "sm90a" in installed and torch.cuda.get_device_capability() == (9, 0):
        assert chosen == "sm90a"
    assert chosen in GPU_BACKENDS


@pytest.mark.skipif("sm90a" not in GPU_BACKENDS, reason="fp8gemm-cuda-sm90a not installed")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", list(KERNEL_SHAPES), ids=lambda s: "x".join(map(str, s)))
def test_every_sm90a_kernel_against_float64(shape, out_dtype):
    """Every compiled kernel, unsplit and in K splits, through a shape the plan maps to it on 132 SMs
    (sm90a_kernel_shapes.py): M and N tails, one-set kernels over several B-scale segments (131 and 150 K blocks),
    warpgroup K splits on odd and even block counts. Another SM count may map a shape to another kernel."""
    case = conformance.Case(*shape, out_dtype, col_major_scales=out_dtype == torch.float32)
    r = conformance.run_case(case, "cuda", torch.float8_e4m3fn, "sm90a")
    assert r.passed, (case.id, KERNEL_SHAPES[shape], r.rel_err, r.detail)
