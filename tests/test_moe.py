"""fp8gemm.fused_experts: numbers against the float64 reference on seeded routings (skewed, empty experts, T = 1,
k > 1, repeated and skipped ids), every backend that runs here; ids only the device sees; one backend lookup per call;
the removed masked layout refused; torch.compile, the fake implementation, no host reads, grad refusal; CUDA-graph
replay on a GPU.

Arch packages run this file unchanged on their GPU: `FP8GEMM_TEST_DEVICE=cuda pytest tests/test_moe.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, cpu_tensors_play_a_gpu, device_under_test, fp8_dtype_for
from fp8gemm import moe, moe_torch, registry
from fp8gemm.moe_reference import reference_fused_experts
from fp8gemm.protocol import GROUPED_CONTIGUOUS, MN_MAJOR, ScaleLayout
from fp8gemm.reference import REFERENCE
from fp8gemm.registry import InstalledBackend, Selection
from fp8gemm.testing import conformance
from fp8gemm.testing.conformance import DEFAULT_SEED
from test_grouped import refuse_host_reads
from test_grouped_dispatch import H100, make_backend

BACKENDS = backends_under_test()
DEVICE = device_under_test()
ON_GPU = DEVICE.type == "cuda"
# Two GEMMs in a row: the down GEMM's contract for the output dtype (bf16 4e-3, fp32 5e-4) plus 2e-3 for the FP8 codes
# of the intermediate that a hardware gate/up product moves to a neighbour when requantized (sm90a, H100: 4.2e-3
# bf16, 1.5e-3 fp32; the reference backend, whose products are exact: 2.5e-3 and 3e-7).
BF16_BOUND, FP32_BOUND = 6e-3, 2.5e-3


@dataclasses.dataclass(frozen=True)
class MoeCase:
    tokens: int
    experts: int
    top_k: int
    hidden: int = 256
    inter: int = 128
    routing: str = "uniform"  # uniform | skewed | sparse | repeated | skipped
    x_dtype: torch.dtype = torch.bfloat16
    weight_dtype: torch.dtype = torch.float32
    pow2: bool = False

    @property
    def id(self) -> str:
        extra = [] if self.x_dtype is torch.bfloat16 else [str(self.x_dtype).removeprefix("torch.")]
        extra += [] if self.weight_dtype is torch.float32 else ["w-" + str(self.weight_dtype).removeprefix("torch.")]
        extra += ["pow2"] if self.pow2 else []
        shape = f"T{self.tokens}-E{self.experts}-k{self.top_k}-H{self.hidden}-I{self.inter}"
        return "-".join([shape, self.routing, *extra])


CASES = [
    MoeCase(1, 8, 1, routing="uniform"),  # decode, one expert
    MoeCase(1, 8, 4, hidden=384, routing="uniform"),  # decode, k > 1
    MoeCase(37, 8, 2, inter=256, routing="skewed"),  # most tokens on two experts
    MoeCase(3, 16, 2, routing="sparse"),  # most experts get no token
    MoeCase(6, 4, 3, routing="repeated"),  # a token naming one expert twice
    MoeCase(20, 6, 2, routing="skipped"),  # -1 ids: slots that select nothing
    MoeCase(65, 8, 8, hidden=128, routing="uniform", weight_dtype=torch.bfloat16),  # k = E
    MoeCase(19, 8, 2, routing="skewed", x_dtype=torch.float32),
    MoeCase(9, 4, 2, routing="uniform", x_dtype=torch.float16, pow2=True),
]


def case_seed(case: MoeCase) -> int:
    return (DEFAULT_SEED * 1_000_003 + zlib.crc32(case.id.encode())) % 2**63


def make_experts(experts: int, hidden: int, inter: int, gen: torch.Generator, fp8_dtype, pow2=False, device=DEVICE,
                 backend="reference"):  # fmt: skip
    """Quantized w13 [E, 2I, H] and w2 [E, H, I], each expert at its own magnitude (a wrong expert shows)."""
    magnitude = torch.rand(experts, 1, 1, generator=gen, device=device) + 0.25
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen, device=device) * magnitude / 16
    down = torch.randn(experts, hidden, inter, generator=gen, device=device) * magnitude / 16
    w13, s13 = fp8gemm.nn.experts.quantize_experts(gate_up, fp8_dtype, pow2)
    w2, s2 = fp8gemm.nn.experts.quantize_experts(down, fp8_dtype, pow2)
    prepare = lambda scale: fp8gemm.prepare_weight_scale(scale, backend=backend)
    return w13, prepare(s13), w2, prepare(s2)


def make_routing(case: MoeCase, gen: torch.Generator, device=DEVICE):
    """(topk_ids int64 [T, k], topk_weights [T, k]) as a softmax/top-k router would give, shaped by ``routing``."""
    t, e, k = case.tokens, case.experts, case.top_k
    logits = torch.randn(t, e, generator=gen, device=device)
    if case.routing == "skewed":
        logits[:, :2] += 4.0
    if case.routing == "sparse":
        logits[:, 3:] -= 8.0  # experts 3.. get nothing from 3 tokens with k = 2
    weights, ids = logits.softmax(-1).topk(k, dim=-1)
    if case.routing == "repeated":
        ids[:, -1] = ids[:, 0]
    if case.routing == "skipped":
        ids[::3, 0] = -1
    return ids, weights.to(case.weight_dtype)


def make_case(case: MoeCase, fp8_dtype, device=DEVICE, backend="reference"):
    seed = case_seed(case)
    print(f"{case.id}: data seed {seed}")
    gen = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(case.tokens, case.hidden, generator=gen, device=device) * 2).to(case.x_dtype)
    experts = make_experts(case.experts, case.hidden, case.inter, gen, fp8_dtype, case.pow2, device, backend)
    return (x, *make_routing(case, gen, device), *experts)


def bound(case: MoeCase) -> float:
    return BF16_BOUND if case.x_dtype is not torch.float32 else FP32_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_numerics_against_float64(case, backend, device):
    x, ids, weights, w13, s13, w2, s2 = make_case(case, fp8_dtype_for(device, backend), backend=backend)
    with torch.no_grad():
        out = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend=backend, pow2_scales=case.pow2)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    expected = reference_fused_experts(x, ids, weights, w13, s13, w2, s2, pow2_scales=case.pow2)
    assert expected.norm() > 0
    err = conformance.relative_error(out, expected)
    assert err < bound(case), f"{case.id} on {backend}: rel. err {err:.3e}"


def test_the_reference_sees_a_wrong_expert_or_weight():
    """The yardstick can fail: a swapped expert or a dropped routing weight is far outside the bound."""
    case = CASES[2]
    x, ids, weights, w13, s13, w2, s2 = make_case(case, torch.float8_e4m3fn, "cpu")
    out = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)
    wrong = reference_fused_experts(x, ids, weights, w13.roll(1, 0), s13.roll(1, 0), w2, s2)
    assert conformance.relative_error(out, wrong) > 0.1
    unweighted = reference_fused_experts(x, ids, torch.ones_like(weights), w13, s13, w2, s2)
    assert conformance.relative_error(out, unweighted) > 0.1


def test_results_are_the_same_bits_on_every_run(device):
    x, ids, weights, w13, s13, w2, s2 = make_case(CASES[6], fp8_dtype_for(device, "reference"))
    runs = [fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend="reference") for _ in range(3)]
    assert all(torch.equal(run, runs[0]) for run in runs)


def test_the_combine_gives_the_same_bits_in_any_chunking(monkeypatch):
    """Large T combines in chunks of tokens: one token per chunk gives what one chunk gives."""
    x, ids, weights, w13, s13, w2, s2 = make_case(CASES[2], torch.float8_e4m3fn, "cpu")
    whole = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)
    monkeypatch.setattr(moe_torch, "COMBINE_CHUNK_BYTES", 1)
    assert torch.equal(fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2), whole)


def test_activations_are_quantized_once_and_gathered_as_fp8():
    """Quantization is per row: gathering FP8 rows and their scales equals quantizing the gathered bf16 rows."""
    gen = torch.Generator().manual_seed(DEFAULT_SEED)
    print(f"seed {DEFAULT_SEED}")
    x = torch.randn(7, 384, generator=gen).bfloat16()
    index = torch.tensor([6, 0, 0, 3, 6, 2, 5, 1])
    q, scale = fp8gemm.quantize_activation(x)
    q_rows, scale_rows = fp8gemm.quantize_activation(x[index])
    assert torch.equal(moe_torch.take_rows(q, index).view(torch.uint8), q_rows.view(torch.uint8))
    assert torch.equal(scale.index_select(0, index), scale_rows)


def test_the_removed_masked_layout_is_refused_and_contiguous_is_the_default():
    """The masked pipeline (T rows per expert) was slower than the contiguous one at every measured T; asking for it
    says so, and layout="contiguous" gives what layout=None gives."""
    x, ids, weights, w13, s13, w2, s2 = make_case(CASES[4], torch.float8_e4m3fn, "cpu")
    default = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)
    assert torch.equal(fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, layout="contiguous"), default)
    with pytest.raises(ValueError, match=r"layout='masked' is no longer a fused_experts pipeline.*0\.10-0\.87x"):
        fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, layout="masked")
    with pytest.raises(ValueError, match="layout='masked'"):
        torch.ops.fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, "silu", False, "masked", "")


def test_ids_only_the_device_sees_select_nothing(monkeypatch):
    """Ids past E, below -1 or at E (which the host does not look at on a GPU) contribute nothing and reach nothing
    outside the tensors: every gather and scatter index stays in range (an out-of-range index raises on the CPU)."""
    case = MoeCase(12, 6, 3, routing="uniform")
    x, ids, weights, w13, s13, w2, s2 = make_case(case, torch.float8_e4m3fn, "cpu")
    monkeypatch.setattr(moe, "check_topk_id_values", lambda ids, experts: None)  # as for ids on a GPU
    ids[0, 0], ids[1, 1], ids[2, 2], ids[5, 0] = 999, -7, 6, -(2**40)
    weights[1, 1] = float("nan")  # the weight of a slot that selects nothing is never used
    out = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)
    valid = (ids >= 0) & (ids < 6)
    expected = reference_fused_experts(x, torch.where(valid, ids, -1), torch.where(valid, weights, 0.0), w13, s13,
                                       w2, s2)  # fmt: skip
    assert bool(out.isfinite().all()) and conformance.relative_error(out, expected) < BF16_BOUND


def test_cpu_ids_outside_the_experts_are_refused():
    x, ids, weights, w13, s13, w2, s2 = make_case(CASES[3], torch.float8_e4m3fn, "cpu")
    ids[1, 1] = 16
    with pytest.raises(ValueError, match=r"topk_ids holds 16, outside \[-1, E = 16\)"):
        fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)


def test_no_tokens_gives_an_empty_result():
    x, ids, weights, w13, s13, w2, s2 = make_case(CASES[0], torch.float8_e4m3fn, "cpu")
    out = fp8gemm.fused_experts(x[:0], ids[:0], weights[:0], w13, s13, w2, s2)
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16


# --- torch integration -------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _small():
    return make_case(MoeCase(10, 4, 2, routing="skewed"), torch.float8_e4m3fn, "cpu")


@pytest.mark.parametrize("compiler", ["record", "aot_eager"])
def test_torch_compile_fullgraph_traces_one_op(compiler, fresh_dynamo):
    x, ids, weights, w13, s13, w2, s2 = _small()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, ids, weights):
        return fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2) * 2

    compiled = torch.compile(layer, fullgraph=True, backend=record if compiler == "record" else compiler)
    with torch.no_grad():
        assert torch.equal(compiled(x, ids, weights), layer(x, ids, weights))
    if compiler == "record":
        (graph,) = graphs
        assert sum(node.target is torch.ops.fp8gemm.fused_experts for node in graph.graph.nodes) == 1


def test_the_compiled_op_body_takes_the_native_op_first(monkeypatch):
    """torch.ops.fp8gemm.fused_experts, what a compiled graph calls, runs the backend's native op as an eager call
    does (its result returned as is): compiled code pays one C++ call, not the Python pipeline."""
    x, ids, weights, w13, s13, w2, s2 = _small()
    marker = torch.full((10, 256), 7.0, dtype=x.dtype)
    calls = []

    class Native:
        def fused_experts(self, *args):
            calls.append(len(args))
            return marker

    monkeypatch.setattr(moe, "native_experts", lambda *args: Native())
    with torch.no_grad():
        assert torch.ops.fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, "silu", False, "", "") is marker
    assert calls == [8]


def test_fake_implementation_shapes_and_trace_time_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, ids, weights, w13, s13, w2, s2 = _small()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in (x.float(), ids, weights, w13, s13, w2, s2)]
        out = torch.ops.fp8gemm.fused_experts(*fake, "silu", False, "", "")
        assert out.shape == (10, 256) and out.dtype == torch.float32
        with pytest.raises(ValueError, match=r"w2 must be \[E, H, I\]"):
            torch.ops.fp8gemm.fused_experts(*fake[:5], fake[5][:, :128], fake[6], "silu", False, "", "")


def test_opcheck():
    x, ids, weights, w13, s13, w2, s2 = _small()
    args = (x, ids, weights, w13, s13, w2, s2, "silu", False, "", "reference")
    tests = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fp8gemm.fused_experts.default, args, test_utils=tests)


def test_an_input_that_requires_grad_is_refused(fresh_dynamo):
    x, ids, weights, w13, s13, w2, s2 = _small()
    grad_weights = weights.clone().requires_grad_()
    message = r"fp8gemm\.fused_experts has no backward, and topk_weights requires grad.*torch\.no_grad"
    with pytest.raises(RuntimeError, match=message):
        fp8gemm.fused_experts(x, ids, grad_weights, w13, s13, w2, s2)
    with pytest.raises(RuntimeError, match=message):
        torch.compile(fp8gemm.fused_experts, fullgraph=True, backend="eager")(x, ids, grad_weights, w13, s13, w2, s2)
    with pytest.raises(RuntimeError, match=r"fused_experts has no backward, and x requires grad"):
        torch.ops.fp8gemm.fused_experts(x.clone().requires_grad_(), ids, weights, w13, s13, w2, s2, "silu", False,
                                        "", "")  # fmt: skip
    with torch.inference_mode():
        assert not fp8gemm.fused_experts(x, ids, grad_weights, w13, s13, w2, s2).requires_grad


def test_the_pipeline_never_reads_values_on_the_host(monkeypatch):
    """On meta tensors, which have no values: checks, routing, quantization, both grouped GEMMs and the combine run
    to the end with every host read refused, so nothing waits on the device. On a GPU: test_gpu_graph_replay."""
    x, ids, weights, w13, s13, w2, s2 = (t.to("meta") for t in _small())
    monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(REFERENCE, "meta plays a GPU"))
    with pytest.MonkeyPatch.context() as reads:
        refuse_host_reads(reads)
        out = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)
    assert out.shape == (10, 256) and out.device.type == "meta"


# --- a backend with grouped kernels: the pipeline's launches --------------------------------------------------------


@pytest.fixture
def fake_grouped(monkeypatch):
    """test_grouped_dispatch's fake backends on a fake H100 whose memory is the host's: "hopper" (every layout,
    MN-major activation scales) and "contiguous_only"; each records the GROUPED_ARGS of its launches."""
    hopper, hopper_calls = make_backend("hopper", a_layout=ScaleLayout(MN_MAJOR, 4))
    only, only_calls = make_backend("contiguous_only", layouts=(GROUPED_CONTIGUOUS,))
    installed = tuple(InstalledBackend(f"{b.name} = fake", "fake", b, None) for b in (hopper, only))
    monkeypatch.setattr(registry, "_discover", functools.lru_cache(maxsize=1)(lambda: installed))
    monkeypatch.setattr(registry, "describe_device", lambda device: H100)
    cpu_tensors_play_a_gpu(monkeypatch)
    registry.clear_caches()
    yield {"hopper": hopper_calls, "contiguous_only": only_calls}
    registry.clear_caches()


def test_a_grouped_kernel_runs_both_gemms(fake_grouped):
    """On a fake H100 whose backend has grouped kernels (MN-major activation scales): two contiguous launches over
    T * k rows, the gate/up product in fp32, the same numbers as the reference backend."""
    x, ids, weights, w13, s13, w2, s2 = _small()
    expected = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend="reference")
    out = fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend="hopper")
    assert torch.equal(out, expected)
    gate_up, down = fake_grouped["hopper"]
    assert gate_up["layout"] == down["layout"] == GROUPED_CONTIGUOUS
    assert (gate_up["n"], gate_up["k"], down["n"], down["k"], gate_up["groups"]) == (256, 256, 256, 128, 4)
    assert gate_up["out_kind"] == 1 and down["out_kind"] == 0  # fp32 gate/up product; bf16 for the combine
    assert gate_up["m"] == 20 and gate_up["expected_m"] == 0  # T * k rows, no hint


@pytest.mark.parametrize("backend", ["reference", "hopper"])
def test_one_backend_lookup_per_call(fake_grouped, monkeypatch, backend):
    """The plan resolves the backend once; the quantizations and both grouped GEMMs run on it without a lookup."""
    x, ids, weights, w13, s13, w2, s2 = _small()
    lookups = []
    select = registry.select
    monkeypatch.setattr(registry, "select", lambda *args, **kw: lookups.append(args) or select(*args, **kw))
    fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend=backend)
    assert len(lookups) == 1


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA or ROCm device")
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_graph_replay(backend):
    """Eager with torch's synchronisation check set to error; then captured once and replayed with other routings
    written into the same tensors: the graph reads them on the device."""
    case = MoeCase(16, 8, 2, routing="uniform")
    x, ids, weights, w13, s13, w2, s2 = make_case(case, fp8_dtype_for(DEVICE, backend), backend=backend)
    call = lambda: fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend=backend)
    with torch.no_grad():
        call()  # warm-up: backend lookup, kept scratch
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        gen = torch.Generator(device=DEVICE).manual_seed(case_seed(case) + 1)
        new_ids, new_weights = make_routing(dataclasses.replace(case, routing="skewed"), gen)
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        assert torch.equal(out, call())
    expected = reference_fused_experts(x, ids, weights, w13, s13, w2, s2)
    assert conformance.relative_error(out, expected) < BF16_BOUND
