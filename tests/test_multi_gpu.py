"""Several GPUs in one process, and one GPU per process: every op runs on its tensors' device, whatever the current
device is, and gives the bits it gives on one GPU.

Skipped with fewer than two GPUs (CI has none); run on a 2-GPU machine with FP8GEMM_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import fp8gemm
import pytest
import torch
from conftest import backends_under_test, device_under_test

pytestmark = pytest.mark.skipif(
    device_under_test().type == "cpu" or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
GPU_BACKENDS = [b for b in backends_under_test() if b != "reference"]
SEED = 20261127
SHAPES = [(1, 2112, 7168), (64, 7168, 2048), (300, 528, 2304)]  # decode (split-K scratch), mid-size, tails


def _layer_inputs(m: int, n: int, k: int, seed: int = SEED):
    print(f"seed {seed}, shape {m}x{n}x{k}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen).bfloat16()
    return x, w, bias


def _linear_on(device: str, x, w, bias, backend: str, current: int | None = None):
    """``fp8gemm.linear`` with every tensor on ``device`` while ``current`` is the current device."""
    with torch.no_grad():
        q, scale = fp8gemm.quantize_weight(w.to(device))
        scale = fp8gemm.prepare_weight_scale(scale, backend=backend)
        inputs = (x.to(device), q, scale, bias.to(device))
        torch.cuda.set_device(current if current is not None else torch.device(device).index)
        y = fp8gemm.linear(*inputs, backend=backend)
        a, a_scale = fp8gemm.quantize_activation(inputs[0], backend=backend)
        g = fp8gemm.gemm(a, q, a_scale, scale, backend=backend)
    assert y.device == torch.device(device) and g.device == torch.device(device)
    return y.cpu(), g.cpu()


@pytest.fixture(autouse=True)
def _restore_current_device():
    before = torch.cuda.current_device()
    yield
    torch.cuda.set_device(before)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_alternating_devices_give_the_same_bits(backend, shape):
    x, w, bias = _layer_inputs(*shape)
    first = _linear_on("cuda:0", x, w, bias, backend)
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        again = _linear_on(device, x, w, bias, backend)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), device


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tensors_on_a_device_that_is_not_the_current_one(backend, shape):
    x, w, bias = _layer_inputs(*shape)
    want = _linear_on("cuda:0", x, w, bias, backend)
    got = _linear_on("cuda:1", x, w, bias, backend, current=0)
    assert torch.cuda.current_device() == 0  # the op switched to the tensors' device and back
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_one_thread_per_device_at_once(backend):
    x, w, bias = _layer_inputs(64, 7168, 2048)
    want = _linear_on("cuda:0", x, w, bias, backend)[0]
    results, errors = {}, []

    def worker(index: int):
        try:
            torch.cuda.set_device(index)
            device = f"cuda:{index}"
            with torch.no_grad():
                q, scale = fp8gemm.quantize_weight(w.to(device))
                xs = x.to(device)
                outs = [fp8gemm.linear(xs, q, scale, bias.to(device), backend=backend) for _ in range(200)]
            torch.cuda.synchronize(index)
            results[index] = [o.cpu() for o in outs[::20]]
        except Exception as exc:  # reported in the main thread
            errors.append(f"cuda:{index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for index in (0, 1):
        assert all(torch.equal(y, want) for y in results[index]), f"cuda:{index}"


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_cuda_graph_on_the_second_device(backend):
    x, w, bias = _layer_inputs(16, 2112, 7168)
    want = _linear_on("cuda:0", x, w, bias, backend)[0]
    torch.cuda.set_device(0)
    with torch.no_grad(), torch.cuda.device(1):
        q, scale = fp8gemm.quantize_weight(w.to("cuda:1"))
        xs, bs = x.to("cuda:1"), bias.to("cuda:1")
        fp8gemm.linear(xs, q, scale, bs, backend=backend)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        # An explicit stream: torch.cuda.graph's default capture stream is made once, on the device current at the
        # first capture in the process, and later captures on other devices would use it.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream("cuda:1")):
            y = fp8gemm.linear(xs, q, scale, bs, backend=backend)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(y.cpu(), want)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_capture_on_one_device_with_tensors_on_another_is_refused(backend):
    """Kernels for tensors on cuda:1 cannot join a graph captured on cuda:0: an error, not a graph that silently
    misses them."""
    x, w, bias = _layer_inputs(16, 2112, 7168)
    with torch.no_grad():
        q, scale = fp8gemm.quantize_weight(w.to("cuda:1"))
        xs = x.to("cuda:1")
        torch.cuda.set_device(0)
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=r"captured on cuda:0, but the tensors are on cuda:1"):
            with torch.cuda.graph(graph, stream=torch.cuda.Stream("cuda:0")):
                fp8gemm.linear(xs, q, scale, backend=backend)


def _model(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(2048, 2048, dtype=torch.bfloat16) for _ in range(4)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.SiLU())])
    fp8gemm.nn.convert(model, skip=())
    return model


def test_a_model_split_over_two_gpus_as_device_map_does():
    """Half the layers on each GPU, the activations moved between them, as accelerate's device_map="auto" runs a
    model: the same logits as the whole model on one GPU."""
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(SEED)).bfloat16()
    whole = _model(SEED).to("cuda:0")
    split = _model(SEED)
    for i, module in enumerate(split):
        module.to("cuda:0" if i < len(split) // 2 else "cuda:1")
    torch.cuda.set_device(0)
    with torch.no_grad():
        want = whole(x.to("cuda:0")).cpu()
        h = x.to("cuda:0")
        for module in split:  # each module's input moved to its device, as accelerate's hooks do
            h = module(h.to(next(iter(module.buffers()), h).device))
        got = h.cpu()
    assert torch.equal(got, want)


def test_two_processes_one_gpu_each_under_torchrun(tmp_path: Path):
    """torchrun, NCCL: each rank runs the layer on its own GPU, the outputs are all-reduced, and every rank's sum
    equals the sum of the layers run one after the other on one GPU."""
    worker = Path(__file__).with_name("multi_gpu_worker.py")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("all-reduced sum matches") == 2, done.stdout
