"""fp8gemm-cuda-sm120's contiguous grouped layout (``offs``) without a GPU: csrc/contiguous_tile.cuh, where each warp
finds the group of its block's row tile from the group ends with shuffles, built with the host compiler over a small
shim (one std::thread per CUDA thread, warp shuffles and ballots through a per-warp exchange) and run for every row
tile y (and -1, and past the last tile) of both tile heights. Every lane of two warps must return what a walk of the
groups one at a time returns (the function it replaced, in the driver): group, first row and row end, bit for bit,
for many groups (up to 700: several 256-group steps), mostly empty, with ends that decrease, pass m or are negative."""

from __future__ import annotations

import random
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import ROOT, require_tool

INT_MAX, INT_MIN = 2**31 - 1, -(2**31)

DRIVER = r"""
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
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

// The walk contiguous_tile replaced: one group end at a time, each clamped to [previous end, m].
template <int BM>
GroupTile walk_tile(const fp8gemm::GroupedParams& p, int y) {
  int begin = 0, first_tile = 0;
  for (int g = 0; g < p.groups; ++g) {
    const int r = p.group_rows[g], end = r < begin ? begin : r > p.m ? p.m : r;
    const int tiles = (end - begin + BM - 1) / BM;
    if (y < first_tile + tiles) return {g, begin + (y - first_tile) * BM, end};
    first_tile += tiles;
    begin = end;
  }
  return {-1, 0, 0};
}

template <int BM>
int check(const fp8gemm::GroupedParams& p) {
  constexpr int kThreads = 64;  // two warps: each finds the tile on its own
  int last = -1;  // y from -1 to two past the last tile
  while (walk_tile<BM>(p, last + 1).group >= 0) ++last;
  const int ys = last + 4;
  std::vector<std::barrier<>*> warps;
  for (int w = 0; w < kThreads / 32; ++w) warps.push_back(new std::barrier<>(32));
  warp_barriers = warps, exchange.assign(kThreads, 0);
  std::vector<GroupTile> got(size_t(kThreads) * ys);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      threadIdx.x = t;
      for (int i = 0; i < ys; ++i) got[size_t(t) * ys + i] = contiguous_tile<BM>(p, i - 1);
    });
  for (auto& t : threads) t.join();
  for (auto* w : warps) delete w;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < ys; ++i) {
      const GroupTile a = got[size_t(t) * ys + i], b = walk_tile<BM>(p, i - 1);
      if (a.group != b.group || a.row0 != b.row0 || a.row_end != b.row_end) {
        std::printf("mismatch BM %d y %d thread %d: %d %d %d, the walk %d %d %d\n", BM, i - 1, t, a.group, a.row0,
                    a.row_end, b.group, b.row0, b.row_end);
        return -1;
      }
    }
  return last + 1;
}

int main() {
  int groups, m;
  while (std::scanf("%d %d", &groups, &m) == 2) {
    std::vector<int32_t> ends(groups);
    for (auto& r : ends) std::scanf("%d", &r);
    fp8gemm::GroupedParams p{};
    p.group_rows = ends.data(), p.m = m, p.groups = groups;
    const int tiles64 = check<64>(p), tiles128 = tiles64 < 0 ? -1 : check<128>(p);  // grouped.cu's two heights
    std::printf("tiles %d %d\n", tiles64, tiles128);
  }
}
"""


@pytest.fixture(scope="module")
def run_lookup(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("sm120_contiguous_tile")
    csrc = ROOT / "packages" / "fp8gemm-cuda-sm120" / "csrc"
    core_include = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"
    (out / "driver.cpp").write_text(DRIVER)
    build = [cxx, "-std=c++20", "-O1", "-pthread", f"-I{csrc}", f"-I{core_include}"]
    subprocess.run([*build, str(out / "driver.cpp"), "-o", str(out / "driver")], check=True)

    def run(ends: list[int], m: int) -> tuple[int, int]:
        text = f"{len(ends)} {m}\n{' '.join(map(str, ends))}\n"
        result = subprocess.run([str(out / "driver")], input=text, capture_output=True, text=True, check=True)
        line = result.stdout.strip().splitlines()[-1]
        assert line.startswith("tiles ") and "-1" not in line.split(), result.stdout
        return tuple(map(int, line.split()[1:]))

    return run


def decode_ends(groups: int, rows: int, rng: random.Random, m: int | None = None) -> tuple[list[int], int]:
    """``rows`` rows spread over a few of ``groups`` groups (a decode batch: most groups empty), cumulative ends."""
    sizes = [0] * groups
    for _ in range(rows):
        sizes[rng.randrange(groups)] += 1
    ends = [sum(sizes[: g + 1]) for g in range(groups)]
    return ends, m if m is not None else max(ends[-1], 1)


def spoil(ends: list[int], m: int, rng: random.Random, count: int) -> list[int]:
    """``count`` ends replaced by values only the device sees: decreasing, past m, negative, the int extremes."""
    ends = list(ends)
    for _ in range(count):
        g = rng.randrange(len(ends))
        values = [-1, INT_MIN, INT_MAX, m + 1, m + rng.randrange(1, 300), ends[g] - rng.randrange(1, 90), 0]
        ends[g] = rng.choice(values)
    return ends


def named_cases() -> list[tuple[str, list[int], int]]:
    rng = random.Random(120)
    cases = []
    for groups in (33, 128, 255, 256, 257, 511, 512, 513, 600):
        ends, m = decode_ends(groups, 8, rng)
        cases.append((f"decode-{groups}", ends, m))
    cases += [
        ("only-the-last-group", [0] * 599 + [300], 300),
        ("only-the-first-group", [130] + [130] * 599, 130),
        ("first-end-past-m", [500, 3, 4, -2] + [7] * 300, 200),
        ("rows-on-both-sides-of-256", [0] * 255 + [70, 140] + [140] * 40, 140),
        ("decreasing-after-the-first-step", [g for g in range(300)] + [5] * 20 + list(range(10, 400)), 395),
        ("negative-and-int-extremes", [INT_MIN, -5, INT_MAX, -1] * 90, 97),
        ("no-rows", [-3] * 300, 50),
        ("every-group-a-row", list(range(1, 701)), 700),
        ("a-tile-in-every-lane", [g * 65 for g in range(1, 520)], 519 * 65),
    ]
    return cases


NAMED = named_cases()


def walk(ends: list[int], m: int, block: int) -> list[tuple[int, int]]:
    """(group, first row) of each row tile, the groups walked in order with their ends clamped to [previous end, m]."""
    tiles, begin = [], 0
    for g, end in enumerate(ends):
        end = min(max(end, begin), m)
        tiles += [(g, row) for row in range(begin, end, block)]
        begin = end
    return tiles


@pytest.mark.parametrize("ends,m", [(e, m) for _, e, m in NAMED], ids=[name for name, _, _ in NAMED])
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
@given(
    groups=st.integers(1, 700),
    rows=st.integers(0, 400),
    spoiled=st.integers(0, 12),
    tail=st.sampled_from([0, 0, 9]),
    seed=st.integers(0, 2**20),
)
def test_drawn_splits_as_the_walk(run_lookup, groups, rows, spoiled, tail, seed):
    rng = random.Random(seed)
    ends, m = decode_ends(groups, rows, rng)
    run_lookup(spoil(ends, m + tail, rng, spoiled), m + tail)
