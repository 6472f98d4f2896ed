"""The gfx942 emulator's one setting, FP8GEMM_GFX942_EMU_THREADS (its README): a thread count runs the grid with that
many OS threads, to the same result; any other value fails the launch with an error that names the variable."""

from __future__ import annotations

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from fp8gemm.testing import conformance
from test_gfx942_emulation import FP8, gfx942_emulator

emulator = test_gfx942_emulation.emulator  # built once for the test run, shared with the kernel tests
mi300x = test_gfx942_emulation.mi300x
VARIABLE = "FP8GEMM_GFX942_EMU_THREADS"


def _gemm(backend: str) -> torch.Tensor:
    case = conformance.Case(40, 256, 1024, torch.float32)  # 2 x 2 workgroups in K splits
    a, b, a_scale, b_scale = conformance.make_inputs(case, FP8, "cpu", torch.Generator().manual_seed(5))
    return fp8gemm.gemm(a, b, a_scale, fp8gemm.prepare_weight_scale(b_scale, backend=backend), backend=backend)


def test_any_thread_count_gives_the_same_result(mi300x, monkeypatch):
    expected = _gemm(mi300x.name)
    for threads in ("1", "3", ""):  # empty: one per CPU core, as unset
        monkeypatch.setenv(VARIABLE, threads)
        assert torch.equal(_gemm(mi300x.name), expected), threads


@pytest.mark.parametrize("value", ["0", "-2", "two", "4097", "8x"])
def test_a_bad_thread_count_names_the_variable(mi300x, monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(gfx942_emulator.EmulationError, match=f"{VARIABLE}={value}: set it to a whole number"):
        _gemm(mi300x.name)
