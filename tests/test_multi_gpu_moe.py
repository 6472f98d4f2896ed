"""The MoE ops with two GPUs in one process: ``fused_experts`` and ``grouped_gemm`` run on their tensors' device
whatever the current device is, give the bits they give on the first GPU, and capture in a CUDA graph on the second.

Skipped with fewer than two GPUs (CI has none); run on a 2-GPU machine with FP8GEMM_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import dataclasses

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test, fp8_dtype_for
from fp8gemm.moe_reference import reference_fused_experts
from fp8gemm.testing import conformance
from test_moe import BF16_BOUND, MoeCase, case_seed, make_case, make_routing

pytestmark = pytest.mark.skipif(
    device_under_test().type == "cpu" or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
GPU_BACKENDS = [b for b in backends_under_test() if b != "reference"]
CASES = [MoeCase(1, 8, 4, hidden=384), MoeCase(37, 8, 2, inter=256, routing="skewed")]  # decode; most rows on two


@pytest.fixture(autouse=True)
def _restore_current_device():
    before = torch.cuda.current_device()
    yield
    torch.cuda.set_device(before)


def _copy(t: torch.Tensor, device: str) -> torch.Tensor:
    """The same bits in the same layout (a prepared scale's padded strides included) on ``device``."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).copy_(t)


def _inputs(case: MoeCase, backend: str, device: str) -> tuple:
    made = make_case(case, fp8_dtype_for(torch.device("cuda:0"), backend), torch.device("cuda:0"), backend)
    return tuple(_copy(t, device) for t in made)


def _fused(inputs: tuple, backend: str) -> torch.Tensor:
    with torch.no_grad():
        return fp8gemm.fused_experts(*inputs, backend=backend)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fused_experts_on_a_device_that_is_not_the_current_one(case, backend):
    torch.cuda.set_device(0)
    want = _fused(_inputs(case, backend, "cuda:0"), backend)
    inputs = _inputs(case, backend, "cuda:1")
    for current in (0, 1, 0):
        torch.cuda.set_device(current)
        got = _fused(inputs, backend)
        assert torch.cuda.current_device() == current  # the op switched to the tensors' device and back
        assert got.device == torch.device("cuda:1") and torch.equal(got.cpu(), want.cpu()), f"current cuda:{current}"
    expected = reference_fused_experts(*(t.cpu() for t in inputs))
    assert conformance.relative_error(got.cpu(), expected) < BF16_BOUND


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_grouped_gemm_on_a_device_that_is_not_the_current_one(backend):
    gen = torch.Generator().manual_seed(case_seed(CASES[1]))
    print(f"seed {case_seed(CASES[1])}")
    fp8 = fp8_dtype_for(torch.device("cuda:0"), backend)
    a, a_scale = fp8gemm.quantize_activation(torch.randn(96, 512, generator=gen).bfloat16().cuda(0), fp8_dtype=fp8)
    b, b_scale = fp8gemm.nn.experts.quantize_experts(torch.randn(3, 256, 512, generator=gen).cuda(0) / 16, fp8, False)
    b_scale = fp8gemm.prepare_weight_scale(b_scale, backend=backend)
    offs = torch.tensor([40, 40, 96], dtype=torch.int32, device="cuda:0")  # the middle expert gets no row
    torch.cuda.set_device(0)
    want = fp8gemm.grouped_gemm(a, b, a_scale, b_scale, offs, backend=backend).cpu()
    got = fp8gemm.grouped_gemm(*(_copy(t, "cuda:1") for t in (a, b, a_scale, b_scale, offs)), backend=backend)
    assert torch.cuda.current_device() == 0 and got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_fused_experts_cuda_graph_on_the_second_device(backend):
    """Captured on cuda:1 while cuda:0 is current outside, replayed with another routing written into the same
    tensors: the bits of an eager call on cuda:0 with that routing."""
    case = CASES[1]
    torch.cuda.set_device(0)
    inputs = _inputs(case, backend, "cuda:1")
    with torch.no_grad(), torch.cuda.device(1):
        _fused(inputs, backend)  # warm-up outside the capture: backend lookup, kept scratch
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream("cuda:1")):
            out = _fused(inputs, backend)
    gen = torch.Generator(device="cuda:0").manual_seed(case_seed(case) + 1)
    ids, weights = make_routing(dataclasses.replace(case, routing="uniform"), gen, torch.device("cuda:0"))
    inputs[1].copy_(ids)
    inputs[2].copy_(weights)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(1)
    on_first = [_copy(t, "cuda:0") for t in inputs]
    want = _fused((on_first[0], ids, weights, *on_first[3:]), backend)
    assert torch.equal(out.cpu(), want.cpu())


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_fused_experts_capture_on_one_device_with_tensors_on_another_is_refused(backend):
    inputs = _inputs(CASES[0], backend, "cuda:1")
    _fused(inputs, backend)
    torch.cuda.set_device(0)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"captured on cuda:0, but the tensors are on cuda:1"):
        with torch.cuda.graph(graph, stream=torch.cuda.Stream("cuda:0")):
            _fused(inputs, backend)
