"""``fp8gemm.training.fused_experts`` forward and backward on the GPU under a CUDA graph and under
``torch.compile(fullgraph=True)``: for a fixed routing (static ids; x, the routing weights, both master weights and the
output gradient static buffers whose values change in place between replays), the replayed output and the gradients
of x, topk_weights, w13 and w2 have an eager call's bits on the same inputs, on uniform routing and on a skewed one
with an empty expert and an expert of more than 128 rows; inductor's compiled forward and backward match eager, and
the layer's ops' fake implementations give the strides of the kernels' outputs (what inductor's graphs assume).

Skipped without a GPU or without a backend whose weight gradient is its k-grouped kernel (the reference's adds on a
GPU come in any order); on an H100/H200:
    FP8GEMM_TEST_DEVICE=cuda python3 -m pytest -q tests/test_gpu_training_experts_graphs.py
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import device_under_test, gpu_backends_with
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import fused_experts, quantize_experts_with_transpose

pytestmark = pytest.mark.skipif(device_under_test().type == "cpu", reason="needs a GPU")

BACKENDS = gpu_backends_with("kgrouped_wgrad_launch")
COMPILE_TOLERANCE = 1e-3  # relative (Frobenius) against eager: one FP8 code flipped in a quantizer shows above it


@dataclasses.dataclass(frozen=True)
class Case:
    tokens: int
    hidden: int
    inter: int
    experts: int
    top_k: int
    routing: str  # uniform | skewed (expert EMPTY gets no token, the first two most of them)
    w_dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"T{self.tokens}-H{self.hidden}-I{self.inter}-E{self.experts}-k{self.top_k}-{self.routing}"


EMPTY = 3
CASES = [
    Case(256, 512, 256, 8, 2, "uniform", torch.bfloat16),
    Case(256, 512, 256, 8, 2, "skewed", torch.float32),  # fp32 master weights, as the FSDP run trains
]


def _routing(case: Case, gen: torch.Generator):
    """topk_ids (int32) and positive topk_weights (fp32) [T, k] from softmax and top-k of random logits."""
    logits = torch.randn(case.tokens, case.experts, generator=gen)
    if case.routing == "skewed":
        logits[:, :2] += 3.0
        logits[:, EMPTY] = float("-inf")
    weights, ids = logits.softmax(-1).topk(case.top_k)
    counts = torch.bincount(ids.reshape(-1), minlength=case.experts)
    if case.routing == "skewed":
        assert counts[EMPTY] == 0 and counts.max() > 128, counts  # an empty expert; one past a 128-token block
    return ids.to(torch.int32), weights


def _values(case: Case, gen: torch.Generator) -> list[torch.Tensor]:
    """x, topk_weights' values aside, w13, w2 and the output gradient on the CPU, never zero (rows and experts at
    different scales, so a row or an expert read in the wrong place shows)."""
    t, h, i, e = case.tokens, case.hidden, case.inter, case.experts

    def nonzero(*shape):
        v = torch.randn(*shape, generator=gen)
        return torch.where(v == 0, 1.0, v)

    magnitude = torch.rand(e, 1, 1, generator=gen) + 0.25
    x = (nonzero(t, h) * (torch.rand(t, 1, generator=gen) * 4 + 0.1)).bfloat16()
    w13 = (nonzero(e, 2 * i, h) * magnitude / 16).to(case.w_dtype)
    w2 = (nonzero(e, h, i) * magnitude / 16).to(case.w_dtype)
    return [x, w13, w2, nonzero(t, h).bfloat16()]


def _draw(case: Case, seed: int):
    """(x, topk_weights, w13, w2), topk_ids and the output gradient on the GPU from a printed seed."""
    print(f"{case.id}: seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    ids, weights = _routing(case, gen)
    x, w13, w2, dout = _values(case, gen)
    return [t.cuda() for t in (x, weights, w13, w2)], ids.cuda(), dout.cuda()


def _step(leaves, ids, dout, backend):
    """The layer's output and the gradients of x, topk_weights, w13 and w2."""
    x, weights, w13, w2 = leaves
    out = fused_experts(x, ids, weights, w13, w2, backend=backend)
    return [out, *torch.autograd.grad(out, leaves, dout)]


def _leaves(values) -> list[torch.Tensor]:
    return [v.clone().requires_grad_() for v in values]


def _eager(values, ids, dout, backend) -> list[torch.Tensor]:
    return _step(_leaves(values), ids, dout, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_captured_step_replays_an_eager_steps_bits_for_a_fixed_routing(backend, case):
    seed = DEFAULT_SEED + 500 + CASES.index(case)
    values, ids, dout = _draw(case, seed)
    leaves = _leaves(values)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants: lazy setup happens here
        for _ in range(2):
            _step(leaves, ids, dout, backend)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _step(leaves, ids, dout, backend)
    names = ("out", "dx", "d_topk_weights", "dw13", "dw2")
    assert [t.dtype for t in static] == [torch.bfloat16, torch.bfloat16, torch.float32, case.w_dtype, case.w_dtype]
    for round_ in range(3):
        new_seed = seed + 1000 * (round_ + 1)
        print(f"round {round_}: new values from seed {new_seed}")
        gen = torch.Generator().manual_seed(new_seed)
        _, new_weights = _routing(case, gen)
        x, w13, w2, new_dout = _values(case, gen)
        with torch.no_grad():
            for buffer, value in zip((*leaves, dout), (x, new_weights, w13, w2, new_dout), strict=True):
                buffer.copy_(value)
            for t in static:
                t.fill_(float("nan"))  # the replay must write every element
        graph.replay()
        want = _eager([t.detach() for t in leaves], ids, dout, backend)
        for name, got, expected in zip(names, static, want, strict=True):
            assert not got.isnan().any(), f"round {round_}: {name} not written by the replay"
            assert torch.equal(got, expected), f"round {round_}: {name} differs from the eager step's bits"
        if case.routing == "skewed":
            assert not static[3][EMPTY].any() and not static[4][EMPTY].any(), "an expert without tokens: zero grads"


@pytest.mark.parametrize("backend", BACKENDS)
def test_inductor_compiled_forward_and_backward_match_eager(backend):
    case = CASES[1]
    values, ids, dout = _draw(case, DEFAULT_SEED + 520)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fused_experts, fullgraph=True)
        leaves = _leaves(values)
        out = compiled(*leaves[:1], ids, *leaves[1:], backend=backend)
        got = [out, *torch.autograd.grad(out, leaves, dout)]
    finally:
        torch._dynamo.reset()
    want = _eager(values, ids, dout, backend)
    for name, g, w in zip(("out", "dx", "d_topk_weights", "dw13", "dw2"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        err = relative_error(g.double(), w.double())
        print(f"{name}: {err:.2e} from eager (bits equal: {torch.equal(g, w)})")
        assert err < COMPILE_TOLERANCE, f"{name}: {err:.2e} from eager"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_ops_fake_implementations_give_the_kernels_strides(backend):
    """torch.library.opcheck on the GPU: the grouped quantizer's and the layer's forward and backward ops' fake
    outputs have the shapes, dtypes and strides of the real ones (scale_t MN-major where the kernel writes it)."""
    case = CASES[1]
    (x, weights, w13, w2), ids, dout = _draw(case, DEFAULT_SEED + 530)
    ops, tests = torch.ops.fp8gemm, ("test_faketensor", "test_aot_dispatch_dynamic")
    offs = torch.tensor([100, 100, 230, 230, 256, 256, 256, 256], dtype=torch.int32, device="cuda")
    torch.library.opcheck(ops.quantize_grouped_transposed.default, (x, offs, None, False, backend), test_utils=tests)
    q13, q2 = (quantize_experts_with_transpose(w, backend=backend) for w in (w13, w2))
    args = (x, ids, weights, q13.q, q13.scale, q2.q, q2.scale, False, True, backend)
    torch.library.opcheck(ops.training_experts_forward.default, args, test_utils=tests)
    _, *saved = ops.training_experts_forward(*args)
    grads_args = (dout, saved, q13.q_t, q13.scale_t, q2.q_t, q2.scale_t, [True] * 4, x.dtype, weights.dtype,
                  w13.dtype, w2.dtype, False, backend)  # fmt: skip
    torch.library.opcheck(ops.training_experts_backward.default, grads_args, test_utils=tests)
