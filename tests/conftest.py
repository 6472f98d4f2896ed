"""Shared fixtures: the device under test and every backend that can run on it."""

from __future__ import annotations

import contextlib
import os

import fp8gemm
import pytest
import torch
from fp8gemm import registry, runtime


def device_under_test() -> torch.device:
    """``$FP8GEMM_TEST_DEVICE``, else the GPU if there is one, else the CPU."""
    name = os.environ.get("FP8GEMM_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def backends_under_test() -> list[str]:
    """The reference plus every installed backend that fits the device (the suite runs on each)."""
    device = device_under_test()
    names = ["reference"]
    if device.type != "cpu":
        info = registry.describe_device(device)
        names += [ib.name for ib in registry.installed_backends() if ib.backend and registry._fits(ib.backend, info)]
    return names


def gpu_backends_with(entry: str) -> list[str]:
    """The backends under test on a GPU whose protocol has the optional ``entry`` (none on a CPU)."""
    if device_under_test().type == "cpu":
        return []
    found = []
    for name in backends_under_test():
        if getattr(registry.select(torch.device("cuda"), name).backend, entry, None) is not None:
            found.append(name)
    return found


def count_calls(monkeypatch, owner, name: str) -> list[int]:
    """``owner.name`` wrapped so each call adds one to the returned counter: a reference fallback cannot pass as the
    kernel."""
    count = [0]
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return count


@pytest.fixture(scope="package")
def device() -> torch.device:
    return device_under_test()


def fp8_dtype_for(device: torch.device, backend: str) -> torch.dtype:
    return fp8gemm.preferred_fp8_dtype(device, backend)


def cpu_tensors_play_a_gpu(monkeypatch, stream: int = 0) -> None:
    """Selection and launch take the GPU path for CPU tensors: they play device 0, whose current stream is ``stream``
    (a backend whose kernels run on host memory, such as a fake or the gfx942 emulation, then runs them)."""
    monkeypatch.setattr(runtime, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "device_index", lambda t: 0 if t.device.type == "cpu" else -1)
    monkeypatch.setattr(runtime, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "raw_stream", lambda index: stream)
    monkeypatch.setattr(runtime, "capturing", lambda: False)
