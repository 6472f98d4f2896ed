"""Every grouped kernel fp8gemm-cuda-sm90a compiles, not only those its plan picks for the suite's shapes: the grouped
conformance cases on each tile in turn (the module's grouped_launch_tile), on a Hopper GPU.

Runs with `FP8GEMM_TEST_DEVICE=cuda pytest tests` where fp8gemm-cuda-sm90a is installed; skipped elsewhere.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import device_under_test
from fp8gemm import registry, runtime
from fp8gemm.registry import Selection
from fp8gemm.testing import conformance_grouped

DEVICE = device_under_test()
sm90a = pytest.importorskip("fp8gemm_cuda_sm90a._C") if DEVICE.type == "cuda" else None
if sm90a is None:
    pytest.skip("the sm90a grouped kernels run on a Hopper GPU", allow_module_level=True)

TILES = list(enumerate(sm90a.grouped_tiles()))
CASES = conformance_grouped.cases(DEVICE, n_random=2)


@pytest.fixture
def on_tile(monkeypatch):
    """Route the grouped ops through one compiled kernel: ``on_tile(index)``, returning the list of its launches. The
    native ops (one C++ call that launches the plan's tile) are left out, so the planner calls ``grouped_launch``."""
    selected = registry.select(DEVICE, "sm90a").backend

    def use(index: int) -> list:
        launched = []

        def launch(args):
            launched.append(index)
            sm90a.grouped_launch_tile(args, index)

        forced = dataclasses.replace(selected, grouped_launch=launch, native=None)
        monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(forced, f"tile {index}"))
        monkeypatch.setattr(runtime, "_fast_backends", {})  # the cached backends hold the native ops
        return launched

    return use


@pytest.mark.parametrize("tile", TILES, ids=[f"{r}x{c}c{k}" for _, (r, c, k) in TILES])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_grouped_kernel_conforms(case, tile, on_tile):
    index, _ = tile
    on_tile(index)
    result = conformance_grouped.run_case(case, DEVICE, torch.float8_e4m3fn, "sm90a")
    assert result.passed, f"{case.id} on grouped tile {tile[1]}: rel. err {result.rel_err:.3e} {result.detail}"


@pytest.mark.parametrize("tile", TILES, ids=[f"{r}x{c}c{k}" for _, (r, c, k) in TILES])
def test_the_forced_tile_is_the_one_launched(tile, on_tile):
    index, _ = tile
    launched = on_tile(index)
    case = conformance_grouped.GroupedCase("offs", (100, 0, 37), 256, 256)
    result = conformance_grouped.run_case(case, DEVICE, torch.float8_e4m3fn, "sm90a")
    assert result.passed and launched == [index], (result.detail, launched)


def test_tile_index_out_of_range_is_refused():
    with pytest.raises(ValueError, match="grouped tile index"):
        sm90a.grouped_launch_tile(0, len(TILES))
