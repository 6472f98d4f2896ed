"""fp8gemm-cuda-sm120's contiguous grouped layout (``offs``) without a GPU: csrc/contiguous_tile.cuh, where each warp
finds the group of its block's row tile from the group ends with shuffles, built with the host compiler over a small
shim (one std::thread per CUDA thread, warp shuffles and ballots through a per-warp exchange) and run for every row
tile y (and -1, and past the last tile) of both tile heights. Every lane of two warps must return what a walk of the
groups one at a time returns (the function it replaced, in tests/contiguous_tile_driver.py): group, first row and row end, bit for bit,
for many groups (up to 700: several 256-group steps), mostly empty, with ends that decrease, pass m or are negative."""

from __future__ import annotations

import pytest
from contiguous_tile_driver import NAMED, build_driver, drawn_split, drawn_splits, named_splits, walk
from hypothesis import given, settings
from isa import ROOT

HEIGHTS = (64, 128)  # grouped.cu's two heights

SHIM = r"""
#include <algorithm>
#define __device__
#define __forceinline__ inline
using std::max;
using std::min;
struct Dim { unsigned x; };
thread_local Dim threadIdx;
std::vector<std::barrier<>*> warp_barriers;
std::vector<int> exchange;
inline void __syncthreads() {}  // row_ids_tile.cuh's, not called here
template <class T> inline T __ldg(const T* p) { return *p; }
inline int lane_read(int v, int src) {  // the value of lane `src` of this thread's warp
  const int warp = threadIdx.x / 32;
  exchange[threadIdx.x] = v;
  warp_barriers[warp]->arrive_and_wait();
  const int got = exchange[warp * 32 + src];
  warp_barriers[warp]->arrive_and_wait();
  return got;
}
inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x % 32;
  return lane_read(v, lane >= d ? lane - d : lane);
}
inline int __shfl_sync(unsigned, int v, int src) { return lane_read(v, src); }
inline unsigned __ballot_sync(unsigned, bool pred) {
  const int warp = threadIdx.x / 32;
  exchange[threadIdx.x] = pred;
  warp_barriers[warp]->arrive_and_wait();
  unsigned bits = 0;
  for (int lane = 0; lane < 32; ++lane) bits |= unsigned(exchange[warp * 32 + lane] != 0) << lane;
  warp_barriers[warp]->arrive_and_wait();
  return bits;
}
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
#include "contiguous_tile.cuh"
using namespace fp8gemm_sm120;

constexpr int kThreads = 64;  // two warps: each finds the tile on its own
constexpr char kThreadName[] = "thread";
void start_threads() {
  for (int w = 0; w < kThreads / 32; ++w) warp_barriers.push_back(new std::barrier<>(32));
  exchange.assign(kThreads, 0);
}
void enter_thread(int t) { threadIdx.x = t; }
void end_threads() {
  for (auto* w : warp_barriers) delete w;
  warp_barriers.clear();
}
"""


@pytest.fixture(scope="module")
def run_lookup(tmp_path_factory):
    csrc = ROOT / "packages" / "fp8gemm-cuda-sm120" / "csrc"
    return build_driver(tmp_path_factory.mktemp("sm120_contiguous_tile"), SHIM, HEIGHTS, csrc)


@named_splits
def test_many_groups_as_the_walk(run_lookup, ends, m):
    assert run_lookup(ends, m) == (len(walk(ends, m, 64)), len(walk(ends, m, 128)))


def test_the_cases_hold_tiles_past_the_first_step():
    """A test of the test data: tiles in groups past the first 256 (a second step), in groups that decrease or pass
    m, and a case with no tile at all."""
    tiles = {name: walk(ends, m, 64) for name, ends, m in NAMED}
    assert tiles["only-the-last-group"] == [(599, row) for row in range(0, 300, 64)]
    assert {g for g, _ in tiles["a-tile-in-every-lane"]} == set(range(519))
    assert [g for g, _ in tiles["rows-on-both-sides-of-256"]] == [255, 255, 256, 256]
    assert max(g for g, _ in tiles["decreasing-after-the-first-step"]) > 512
    assert tiles["first-end-past-m"] == [(0, row) for row in range(0, 200, 64)] and not tiles["no-rows"]
    assert sum(1 for name in tiles if name.startswith("decode-") and max(g for g, _ in tiles[name]) >= 256) >= 3


@settings(max_examples=25, deadline=None)
@given(**drawn_splits(max_rows=400))
def test_drawn_splits_as_the_walk(run_lookup, groups, rows, spoiled, tail, seed):
    run_lookup(*drawn_split(groups, rows, spoiled, tail, seed))
