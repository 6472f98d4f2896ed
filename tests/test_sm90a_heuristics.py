"""fp8gemm-cuda-sm90a's plan (csrc/heuristics.hpp) without a GPU: the header is plain C++, so a
small driver built with the host compiler prints the plan for shapes that hypothesis draws, and
every plan must be one the kernels can run: a compiled tile, K splits that cover K exactly, at
most one CTA per SM, a workspace that holds the partials."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import sm90a_host_driver
from sm90a_kernel_shapes import KERNEL_SHAPES

DRIVER = r"""
#include <cstdio>
#include "heuristics.hpp"
int main() {
  long long m, n, k; int sms;
  while (std::scanf("%lld %lld %lld %d", &m, &n, &k, &sms) == 4) {
    const auto p = fp8gemm_sm90a::plan_for(m, n, k, sms);
    const auto& t = p.tile;
    std::printf("%d %d %d %d %d %d %d %d %lld %d %d %d %d\n", t.rows, t.cols, t.cluster, p.m_blocks, p.n_blocks,
                p.splits, p.kb_per_split, p.grid, (long long)p.workspace_bytes,
                (int)(fp8gemm_sm90a::tile_index(t) >= 0), p.group_m, (int)p.placement_pairs, (int)t.loop);
  }
}
"""
FIELDS = ("rows cols cluster m_blocks n_blocks splits kb_per_split grid workspace compiled group_m pairs loop").split()
TWO_SETS, ONE_SET, SPLIT_WARPGROUPS = 0, 1, 2  # tile_config.hpp MainLoop


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    driver = sm90a_host_driver(tmp_path_factory.mktemp("sm90a_plan"), DRIVER)

    def run(shapes):
        out = driver("".join(f"{m} {n} {k} {sms}\n" for m, n, k, sms in shapes))
        return [dict(zip(FIELDS, map(int, line.split()), strict=True)) for line in out.splitlines()]

    return run


def plan_fields(plan, shapes, *names):
    """The named plan fields of each shape on 132 SMs (H100/H200 SXM), as tuples; besides the plan's own,
    "slices" (64-row slices: rows / 64), "one_set" and "wg_split" (the main loop is that one)."""
    derived = {"slices": lambda p: p["rows"] // 64, "one_set": lambda p: int(p["loop"] == ONE_SET),
               "wg_split": lambda p: int(p["loop"] == SPLIT_WARPGROUPS)}  # fmt: skip
    got = plan([(*s, 132) for s in shapes])
    return [tuple(derived[name](p) if name in derived else p[name] for name in names) for p in got]


def check_plan(p, m, n, k, sms):
    kb = k // 128
    assert p["compiled"], p  # one of tile_config.hpp kTiles, main loop included
    assert p["m_blocks"] == math.ceil(m / p["rows"]) and p["n_blocks"] == math.ceil(n / p["cols"])
    assert p["kb_per_split"] * (p["splits"] - 1) < kb <= p["kb_per_split"] * p["splits"]  # no empty split
    assert 0 <= p["grid"] <= sms
    assert p["workspace"] == (p["splits"] * m * n * 4 if p["splits"] > 1 else 0)
    if m <= 64:
        assert p["rows"] == 64  # no padding rows for decode
    assert p["group_m"] in (2, 4, 16)
    if p["pairs"]:  # placement pairs: 1-CTA tiles sharing B blocks, whole clusters of 2
        assert p["cluster"] == 1 and p["m_blocks"] >= 2 and p["grid"] % 2 == 0
    if p["loop"] == ONE_SET and p["rows"] <= 128 and p["cols"] <= 128:  # a two-set shape on long K
        assert (p["rows"], p["cols"], p["cluster"]) == (128, 128, 1) and p["kb_per_split"] >= 24
    if p["loop"] == SPLIT_WARPGROUPS:
        assert (p["rows"], p["cluster"]) == (64, 1) and p["cols"] in (16, 32) and p["kb_per_split"] >= 48


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 20000), st.integers(1, 3000).map(lambda x: 16 * x), st.integers(1, 200).map(lambda x: 128 * x),
    st.sampled_from([132, 114, 78]),  # H100/H200 SXM, H100 PCIe, a partitioned GPU
)  # fmt: skip
def test_every_plan_is_runnable(plan, m, n, k, sms):
    check_plan(plan([(m, n, k, sms)])[0], m, n, k, sms)


def test_plan_choices_on_the_benchmark_shapes(plan):
    """The fastest tiles measured (docs/decisions.md): 256 x 128 where it fills the waves (8192^3 too), 192 x 128
    where that fits better (4096x2112x7168), 128 x 160 and 128 x 96 where their widths fill the waves of N,
    64-row tiles for decode (full K on 132 16-wide tiles for N = 2112), and for 65-128 rows no K split that
    cannot beat one pass over the weights at DRAM speed (heuristics.hpp)."""
    shapes = [
        (4096, 7168, 16384),
        (8192, 8192, 8192),
        (4096, 2112, 7168),
        (64, 7168, 16384),
        (64, 32768, 512),
        (64, 2112, 7168),
        (128, 7168, 16384),
        (96, 7168, 16384),
        (80, 4096, 7168),
        (160, 4096, 14336),
        (768, 1536, 7168),
        (320, 4096, 7168),
        (64, 18432, 7168),
    ]
    got = plan([(*s, 132) for s in [*shapes, (0, 256, 512)]])
    assert [(p["rows"] // 64, p["cols"], p["splits"]) for p in got[:13]] == [
        (4, 128, 1),
        (4, 128, 1),
        (3, 128, 1),  # 2 x 192: level under do_bench, 5% slower kernels
        (1, 64, 1),
        (1, 128, 1),
        (1, 16, 1),
        (2, 64, 1),  # B streams at DRAM speed either way: no K split (and no reduction) for 128 rows
        (2, 64, 1),  # 96 rows too: the tile loads only M rows (2 x 128 in 2 splits measured 10% slower)
        (1, 64, 1),  # 2 x 128 in 4 splits: B at DRAM speed plus a reduction (measured 5% slower)
        (3, 128, 4),  # above 128 rows 192-row tiles in K splits (2 x 128 in 2 splits: 12% slower)
        (2, 160, 2),  # 120 work items in one wave (256 x 128 in 3 splits: 14% slower)
        (2, 96, 1),  # 129 tiles in one wave (128 x 192 in 2 splits: 22% slower, 128 x 128: 11%)
        (1, 96, 1),  # 192 tiles in two waves (64 x 64: 288 in three, 9% slower)
    ]
    assert got[13]["grid"] == 0  # M = 0: nothing to launch, and no division by zero


def test_rasterisation_pairs_m_blocks_only_in_a_single_unsplit_wave(plan):
    """M blocks are walked in pairs only when every CTA takes one tile of <= 96 columns and there are >= 4 M
    blocks (measured 1.07x at 1024x1536x7168, 1.13-1.16x at 1024x1024x7168 and 768x2048x7168; docs/decisions.md);
    otherwise in groups of 16 (pairs measured 0.92x at 4096x32768x512, 4 waves)."""
    shapes = [(1024, 1536, 7168), (768, 2048, 7168), (1024, 1024, 7168), (4096, 4096, 7168), (4096, 32768, 512),
              (2048, 576, 7168), (384, 2112, 7168), (1024, 3072, 1536), (128, 7168, 16384)]  # fmt: skip
    assert plan_fields(plan, shapes, "cols", "m_blocks", "splits", "grid", "group_m") == [
        (96, 8, 1, 128, 2),  # 128 tiles of 128 x 96
        (96, 6, 1, 132, 2),
        (64, 8, 1, 128, 2),
        (128, 16, 1, 132, 16),  # 256 x 128 in clusters: 4 waves
        (128, 16, 1, 132, 16),
        (160, 16, 2, 128, 16),  # one wave, but of K splits (pairs measured 0.96x)
        (64, 3, 1, 100, 16),  # 3 M blocks (pairs measured 0.97x); 99 tiles, launched in placement pairs
        (192, 8, 1, 128, 16),  # wide tiles: pairs measured 0.95x and 1.03x in two runs
        (64, 1, 1, 112, 16),
    ]


def test_placement_pairs_only_for_unclustered_tiles_that_share_b(plan):
    """1-CTA tiles launch as 2-CTA clusters (placement only) when consecutive tiles share a B block (>= 2 M
    blocks): measured up to 1.16x (768x2048x7168, 128x4096x7168), level with one M block (docs/decisions.md)."""
    shapes = [(128, 4096, 7168), (768, 2048, 7168), (4096, 2112, 7168), (384, 2112, 7168), (64, 2112, 7168),
              (128, 32768, 512), (4096, 4096, 7168), (1, 16, 128)]  # fmt: skip
    assert plan_fields(plan, shapes, "pairs", "grid") == [
        (1, 128),
        (1, 132),
        (1, 132),
        (1, 100),  # 99 tiles: one CTA more, which finds no tile
        (0, 132),  # one M block: a pair would share only the small A block
        (0, 132),
        (0, 132),  # 256 x 128 tiles in multicast clusters already
        (0, 1),
    ]
    assert plan([(129, 16, 128, 3)])[0]["pairs"] == 0  # 3 tiles on 3 SMs: a fourth CTA does not fit


def test_groups_of_four_where_a_wave_touches_fewer_rows(plan):
    """Multi-wave plans of unclustered tiles walk M blocks in groups of 4 where a wave then touches fewer rows of A
    and B than with groups of 16 (measured 1.04x at 4096x2112x7168 and 6144x2112x7168; docs/decisions.md)."""
    shapes = [(4096, 2112, 7168), (6144, 1536, 4096), (3072, 2112, 2048), (6144, 7168, 2304), (1536, 4096, 7168),
              (2048, 2112, 7168), (4096, 4096, 7168), (2048, 1536, 7168)]  # fmt: skip
    assert plan_fields(plan, shapes, "slices", "cols", "cluster", "group_m") == [
        (3, 128, 1, 4),  # 22 x 17 tiles of 192 x 128: a wave spans all 17 N blocks of 8 M blocks
        (3, 128, 1, 4),
        (2, 192, 1, 4),
        (3, 128, 1, 16),  # 56 N blocks: groups of 16 touch fewer
        (3, 128, 1, 16),
        (2, 160, 1, 16),
        (4, 128, 2, 16),  # multicast clusters keep 16
        (3, 128, 1, 16),  # one wave (132 tiles): the order only places tiles
    ]


def test_one_set_loop_for_128_wide_tiles_on_long_k(plan):
    """128 x 128 tiles run the one-set K loop from 24 K blocks per tile: measured 1.03-1.04x from 32 K blocks
    (200x7168x7168, 512x4096x4096), 0.92x at 12 (640x3072x1536), 0.98x at 4 (128x32768x512; docs/decisions.md)."""
    shapes = [(200, 7168, 7168), (512, 4096, 4096), (129, 7168, 2048), (640, 3072, 1536), (128, 32768, 512),
              (200, 7168, 3072), (1024, 1536, 7168), (4096, 4096, 7168), (256, 7168, 7168)]  # fmt: skip
    assert plan_fields(plan, shapes, "slices", "cols", "kb_per_split", "one_set") == [
        (2, 128, 56, 1),
        (2, 128, 32, 1),
        (2, 128, 16, 0),
        (2, 128, 12, 0),
        (2, 128, 4, 0),
        (2, 128, 24, 1),
        (2, 96, 56, 0),  # 96-wide: the two-set loop measured faster
        (4, 128, 56, 1),  # 256-row tiles: the one-set loop is their only one
        (2, 128, 56, 1),
    ]


def test_warpgroup_k_split_for_narrow_tiles_on_long_k(plan):
    """64 x 16 tiles split their K blocks over two warpgroups from 48 K blocks per tile: measured 1.05-1.15x at
    56-128 (64x2112x7168 1.095, 64x2112x16384 1.150, 64x1536x7168 1.054), mixed at 32 (48x2112x4096,
    1x1536x4096; docs/decisions.md). 64 x 32 tiles too: 1.035-1.047x at 80-128 x 2048-2112 x 7168, level at
    64 x 3072-4096 x 7168."""
    shapes = [(64, 2112, 7168), (1, 2112, 7168), (64, 2112, 16384), (64, 1536, 7168), (48, 2112, 4096),
              (64, 2112, 2048), (64, 256, 7168), (64, 4096, 7168), (128, 2112, 7168), (128, 2112, 4096),
              (128, 4096, 7168)]  # fmt: skip
    assert plan_fields(plan, shapes, "slices", "cols", "kb_per_split", "wg_split") == [
        (1, 16, 56, 1),
        (1, 16, 56, 1),
        (1, 16, 128, 1),
        (1, 16, 56, 1),
        (1, 16, 32, 0),
        (1, 16, 16, 0),
        (1, 16, 7, 0),  # split-K plans keep one warpgroup on their short splits
        (1, 32, 56, 1),
        (1, 32, 56, 1),  # two M blocks of 64 x 32
        (1, 32, 32, 0),
        (1, 64, 56, 0),  # wider tiles keep one warpgroup per 64 rows (every-tile split: 0.94x at 128x4096x7168)
    ]


COMPILED_KERNELS = r"""
#include <cstdio>
#include "tile_config.hpp"
int main() {
  for (const auto& t : fp8gemm_sm90a::kTiles) std::printf("%d %d %d %d\n", t.rows, t.cols, t.cluster, (int)t.loop);
}
"""


def test_the_gpu_tests_shapes_reach_every_compiled_kernel(plan, tmp_path_factory):
    """The plan has no settings, so the GPU tests reach each kernel through a shape (sm90a_kernel_shapes.py): each
    of those shapes must still pick its kernel, with tails in M and N, and together they must pick every kernel the
    package compiles, each unsplit and (where the plan ever splits it) in K splits."""
    got = plan_fields(plan, list(KERNEL_SHAPES), "rows", "cols", "cluster", "loop", "splits")
    assert [(r, c, cl, loop, splits > 1) for r, c, cl, loop, splits in got] == list(KERNEL_SHAPES.values())
    assert all(m == 1 or (m % rows and n % cols) for (m, n, _), (rows, cols, *_) in KERNEL_SHAPES.items())
    listing = sm90a_host_driver(tmp_path_factory.mktemp("sm90a_kernels"), COMPILED_KERNELS)("")
    compiled = {tuple(map(int, line.split())) for line in listing.splitlines()}
    assert {kernel[:4] for kernel in KERNEL_SHAPES.values()} == compiled
