"""fp8gemm-cuda-sm90a's weight-gradient plan (csrc/heuristics.hpp wgrad_plan_for) without a GPU, through a host-compiled
driver as tests/test_sm90a_heuristics.py does for the GEMM's: every plan names a compiled kWgradTiles kernel, never
splits K (the kernel adds into out), fits its grid on the SMs, keeps 192-row tiles off M <= 128; and
the GPU tests' shapes (sm90a_kernel_shapes.py WGRAD_KERNEL_SHAPES) reach each compiled kernel."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import sm90a_host_driver
from sm90a_kernel_shapes import KGROUPED_WGRAD_KERNEL_SHAPES, WGRAD_KERNEL_SHAPES, kgrouped_plan_args

DRIVER = r"""
#include <cstdio>
#include "heuristics.hpp"
int main() {
  long long m, n, k, experts; int sms, tma_store;
  while (std::scanf("%lld %lld %lld %d %lld %d", &m, &n, &k, &sms, &experts, &tma_store) == 6) {
    const auto p = fp8gemm_sm90a::wgrad_plan_for(m, n, k, sms, experts, tma_store != 0);
    const auto& t = p.tile;
    std::printf("%d %d %d %d %d %d %d %d %d\n", t.rows, t.cols, t.cluster, (int)t.loop, p.m_blocks, p.n_blocks, p.grid,
                p.group_m, fp8gemm_sm90a::wgrad_tile_index(t));
  }
  std::printf("compiled %d\n", fp8gemm_sm90a::kWgradTileCount);
}
"""
FIELDS = "rows cols cluster loop m_blocks n_blocks grid group_m index".split()
ONE_SET = 1


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    driver = sm90a_host_driver(tmp_path_factory.mktemp("sm90a_wgrad_plan"), DRIVER)

    def run(shapes):
        lines = driver("".join(f"{m} {n} {k} {sms} {' '.join(map(str, rest or (1, 0)))}\n"
                               for m, n, k, sms, *rest in shapes)).splitlines()  # fmt: skip
        assert lines[-1] == "compiled 4"
        return [dict(zip(FIELDS, map(int, line.split()), strict=True)) for line in lines[:-1]]

    return run


def check_plan(p, m, n, sms):
    assert p["index"] >= 0 and p["loop"] == ONE_SET and p["cluster"] == 1, p
    assert p["m_blocks"] == math.ceil(m / p["rows"]) and p["n_blocks"] == math.ceil(n / p["cols"])
    assert p["grid"] == min(p["m_blocks"] * p["n_blocks"], sms)
    if m <= 128:
        assert p["rows"] == 128


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40000), st.integers(1, 3000).map(lambda x: 16 * x), st.integers(1, 200).map(lambda x: 128 * x),
    st.sampled_from([132, 114, 78, 1]),  # H100/H200 SXM, H100 PCIe, a partitioned GPU, one SM
)  # fmt: skip
def test_every_wgrad_plan_is_runnable(plan, m, n, k, sms):
    check_plan(plan([(m, n, k, sms)])[0], m, n, sms)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300).map(lambda x: 16 * x), st.integers(1, 300).map(lambda x: 16 * x),
    st.integers(1, 24).map(lambda x: 128 * x), st.integers(2, 300), st.booleans(), st.sampled_from([132, 114, 1]),
)  # fmt: skip
def test_every_kgrouped_wgrad_plan_is_runnable(plan, m, n, k, experts, tma_store, sms):
    """A k-grouped launch's plan: every expert's tiles in one grid, and bf16 out through TMA stores with few tokens per
    expert on the 128 x 128 tile (heuristics.hpp kTmaStoreMaxTokens)."""
    p = plan([(m, n, k, sms, experts, int(tma_store))])[0]
    assert p["index"] >= 0 and p["loop"] == ONE_SET and p["cluster"] == 1, p
    assert p["m_blocks"] == math.ceil(m / p["rows"]) and p["n_blocks"] == math.ceil(n / p["cols"])
    assert p["grid"] == min(p["m_blocks"] * p["n_blocks"] * experts, sms)
    if m <= 128:
        assert p["rows"] == 128
    if tma_store and k <= 1024:
        assert (p["rows"], p["cols"]) == (128, 128)


def test_the_gpu_tests_reach_every_wgrad_kernel(plan):
    got = plan([(*shape, 132) for shape in WGRAD_KERNEL_SHAPES])
    assert [(p["rows"], p["cols"], p["cluster"]) for p in got] == list(WGRAD_KERNEL_SHAPES.values())
    assert {p["index"] for p in got} == {0, 1, 2, 3}


def test_the_gpu_tests_reach_every_kgrouped_wgrad_kernel(plan):
    got = plan([kgrouped_plan_args(*case) for case in KGROUPED_WGRAD_KERNEL_SHAPES])
    assert [(p["rows"], p["cols"], p["cluster"]) for p in got] == list(KGROUPED_WGRAD_KERNEL_SHAPES.values())
    assert {p["index"] for p in got} == {0, 1, 2, 3}


def test_training_shapes_take_the_measured_fastest_tile(plan):
    """Llama-3-8B's and DeepGEMM's weight gradients (out_features x in_features over 4096 tokens): the tile the H200
    ran fastest with each tile forced (docs/training.md), but on 4096 x 4096, where 128 x 160's waves fill worse and the
    model's 128 x 128 came within 3% of it."""
    shapes = {(6144, 4096, 4096): (128, 192), (4096, 4096, 4096): (128, 128), (28672, 4096, 4096): (128, 160),
              (4096, 14336, 4096): (128, 160), (2112, 7168, 4096): (128, 160), (576, 7168, 4096): (128, 160),
              (24576, 1536, 4096): (128, 192), (32768, 512, 4096): (128, 128), (7168, 16384, 4096): (128, 160),
              (4096, 7168, 4096): (128, 160), (7168, 2048, 4096): (128, 160)}  # fmt: skip
    got = plan([(*s, 132) for s in shapes])
    assert [(p["rows"], p["cols"]) for p in got] == list(shapes.values())


def test_kgrouped_bf16_out_with_few_tokens_takes_the_tma_store_tile(plan):
    """heuristics.hpp kTmaStoreMaxTokens: a k-grouped launch whose bf16 out takes TMA stores and whose experts hold at
    most 1024 tokens each runs the 128 x 128 tile (the k-grouped one that stores bf16 through TMA); fp32 out keeps the
    rate model's pick (Qwen3-30B-A3B's dW13 at 4096 tokens: 128 x 160), bf16 out with more tokens the rate model's
    pick among the tiles whose bf16 out takes TMA stores (64-column boxes: not 128 x 160, whose stores are direct)."""
    qwen_dw13 = (1536, 2048, 256, 132, 128)
    got = plan([(*qwen_dw13, 1), (*qwen_dw13, 0), (1536, 2048, 2048, 132, 128, 1)])
    assert [(p["rows"], p["cols"]) for p in got] == [(128, 128), (128, 160), (128, 192)]
    assert all(p["index"] >= 0 and 0 < p["grid"] <= 132 for p in got)
