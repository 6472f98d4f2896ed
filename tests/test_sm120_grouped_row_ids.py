"""fp8gemm-cuda-sm120's row-ids layout (grouped_gemm with m_indices) without a GPU: csrc/row_ids_tile.cuh, the block
walk that finds each block's row tiles in one pass over the ids, built with the host compiler over a small shim (one
std::thread per CUDA thread, __syncthreads a std::barrier, warp shuffles through a per-warp exchange) and run for
every block row of the planned grid (csrc/heuristics.hpp grouped_plan_for). The tiles must be the runs of each id in
[0, G) cut into BM-row tiles from their first row: every such row in exactly one tile, no -1 row (nor any id outside
[0, G)) in any, and rows sorted by expert tiled as ``offs`` tiles them."""

from __future__ import annotations

import random
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import ROOT, require_tool

DRIVER = r"""
#include <barrier>
#include <cstdio>
#include <thread>
#include <vector>
#include <cstdint>
#define __device__
#define __forceinline__ inline
struct Dim { unsigned x; };
thread_local Dim threadIdx;
std::barrier<>* block_barrier;
std::vector<std::barrier<>*> warp_barriers;
std::vector<int> exchange;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  exchange[threadIdx.x] = v;
  warp_barriers[warp]->arrive_and_wait();
  const int got = lane >= d ? exchange[threadIdx.x - d] : v;
  warp_barriers[warp]->arrive_and_wait();
  return got;
}
#include "heuristics.hpp"
#include "row_ids_tile.cuh"
using namespace fp8gemm_sm120;

template <int BM, int kThreads>
void run_grid(const fp8gemm::GroupedParams& p, long long grid_y) {
  std::vector<int> scratch(kThreads / 32 + 2);
  for (long long by = 0; by < grid_y; ++by) {
    std::barrier<> bar(kThreads);
    std::vector<std::barrier<>*> warps;
    for (int w = 0; w < kThreads / 32; ++w) warps.push_back(new std::barrier<>(32));
    block_barrier = &bar, warp_barriers = warps, exchange.assign(kThreads, 0);
    std::vector<GroupTile> found;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        threadIdx.x = t;
        RowIdsCursor cursor;
        for (long long tile = by; tile < p.row_tiles; tile += grid_y) {
          const GroupTile g = row_ids_tile<BM, kThreads>(p, static_cast<int>(tile), cursor, scratch.data());
          if (t == 0 && g.group >= 0) found.push_back(g);
          if (g.group < 0) break;
        }
      });
    for (auto& t : threads) t.join();
    for (auto* w : warps) delete w;
    for (const auto& g : found) std::printf("%d %d %d\n", g.group, g.row0, g.row_end);
  }
}

int main() {
  int groups, m, sms;
  while (std::scanf("%d %d %d", &groups, &m, &sms) == 3) {
    std::vector<int32_t> ids(m);
    for (auto& r : ids) std::scanf("%d", &r);
    const GroupedPlan plan = grouped_plan_for(fp8gemm::kGroupedRowIds, m, 4096, groups, 0, sms);
    fp8gemm::GroupedParams p{};
    p.group_rows = ids.data(), p.m = m, p.groups = groups, p.row_ids = 1;
    p.row_tiles = static_cast<int>(plan.row_tiles);
    std::printf("plan %d %lld %lld\n", plan.block_m, (long long)plan.grid_y, (long long)plan.row_tiles);
    // grouped.cu's two kernels: Traits<1, 4> (64 rows, 4 warps) and Traits<2, 3> (128 rows, 8 warps)
    if (plan.config == TileConfig::M64) run_grid<64, 128>(p, plan.grid_y);
    else run_grid<128, 256>(p, plan.grid_y);
    std::printf("end\n");
  }
}
"""


@pytest.fixture(scope="module")
def run_blocks(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("sm120_row_ids")
    csrc = ROOT / "packages" / "fp8gemm-cuda-sm120" / "csrc"
    core_include = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"
    (out / "driver.cpp").write_text(DRIVER)
    build = [cxx, "-std=c++20", "-O1", "-pthread", f"-I{csrc}", f"-I{core_include}"]
    subprocess.run([*build, str(out / "driver.cpp"), "-o", str(out / "driver")], check=True)

    def run(ids: list[int], groups: int, sms: int = 2):
        text = f"{groups} {len(ids)} {sms}\n{' '.join(map(str, ids))}\n"
        lines = subprocess.run([str(out / "driver")], input=text, capture_output=True, text=True, check=True).stdout
        lines = lines.splitlines()
        assert lines[0].startswith("plan ") and lines[-1] == "end"
        block, grid_y, row_tiles = map(int, lines[0].split()[1:])
        return block, grid_y, row_tiles, [tuple(map(int, line.split())) for line in lines[1:-1]]

    return run


def want_tiles(ids: list[int], groups: int, block: int) -> list[tuple[int, int, int]]:
    """Each run of one id in [0, groups), cut into block-row tiles from its first row."""
    tiles, start = [], 0
    for row in range(1, len(ids) + 1):
        if row == len(ids) or ids[row] != ids[start]:
            if 0 <= ids[start] < groups:
                tiles += [(ids[start], r, min(r + block, row)) for r in range(start, row, block)]
            start = row
    return tiles


def check(run_blocks, ids: list[int], groups: int, sms: int = 2) -> None:
    block, grid_y, row_tiles, tiles = run_blocks(ids, groups, sms)
    assert 1 <= grid_y <= row_tiles
    assert sorted(tiles) == sorted(want_tiles(ids, groups, block))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 700), groups=st.integers(1, 6), minus=st.sampled_from([0.0, 0.4]), seed=st.integers(0, 999))
def test_any_order_tiles_every_run(run_blocks, m, groups, minus, seed):
    rng = random.Random(seed)
    check(run_blocks, [-1 if rng.random() < minus else rng.randrange(groups) for _ in range(m)], groups)


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8), pad=st.sampled_from([0, 128]))
def test_sorted_and_deepgemm_padded_ids(run_blocks, sizes, pad):
    ids = []
    for g, size in enumerate(sizes):
        ids += [g] * size + [-1] * (-size % pad if pad else 0)
    check(run_blocks, ids or [-1], len(sizes), sms=1)


@pytest.mark.parametrize(
    "ids",
    [
        [0] * 300 + [1] * 2 + [0] * 31,
        [2] * 256,
        [1] * 800,  # a run over whole chunks with no run start in them
        [-1] * 5 + [0] * 700 + [2] * 3,
        [0, 1] * 150,
        [-1] * 300,
        [7, -3, 0, 0, 5, 1, 1, 2**31 - 1, 1],
        [0],
    ],
)
def test_runs_across_chunks_and_ids_outside_the_experts(run_blocks, ids):
    check(run_blocks, ids, 3)
