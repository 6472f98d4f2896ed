"""fp8gemm-rocm-gfx942's contiguous grouped layout (``offs``) with many groups, two ways without a GPU.

csrc/contiguous_tile.hpp, where each wavefront finds the group of its workgroup's row tile from the group ends with
cross-lane reads, built with the host compiler over a small shim (one std::thread per work-item of a 64-lane
wavefront, ds_bpermute through an exchange, as the CPU emulator's build takes it: no readlane) and run for every row
tile y (and -1, and past the last tile) of both tile heights: every lane must return what a walk of the groups one at
a time returns (the function it replaced, in the driver), bit for bit, on the cases of
test_sm120_grouped_contiguous_tile.py (up to 700 groups, mostly empty, ends that decrease, pass m or are negative).
Then the grouped kernel itself (csrc/grouped.hip) on the CPU emulator with hundreds of groups, each against a float64
oracle (test_gfx942_emulation_grouped's checks: rows outside every group stay NaN)."""

from __future__ import annotations

import random
import subprocess

import pytest
import test_gfx942_emulation
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import ROOT, require_tool
from test_gfx942_emulation_grouped import Problem, check, launch_once
from test_sm120_grouped_contiguous_tile import INT_MAX, NAMED, decode_ends, spoil, walk

emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run

HIP_RUNTIME = r"""
// The few HIP names csrc/contiguous_tile.hpp uses, on host threads (the driver defines them).
#pragma once
#define __device__
int emulated_bpermute(int byte_address, int value);
unsigned emulated_workitem_id();
#define __builtin_amdgcn_ds_bpermute(address, value) emulated_bpermute((address), (value))
#define __builtin_amdgcn_workitem_id_x() emulated_workitem_id()
"""

DRIVER = r"""
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
#include "contiguous_tile.hpp"
using namespace fp8gemm_gfx942;

constexpr int kLanes = 64;
thread_local unsigned workitem;
std::barrier<>* wave_barrier;
std::vector<int> exchange(kLanes);
unsigned emulated_workitem_id() { return workitem; }
int emulated_bpermute(int byte_address, int value) {  // lane (address / 4) mod 64's value
  exchange[workitem % kLanes] = value;
  wave_barrier->arrive_and_wait();
  const int got = exchange[(static_cast<unsigned>(byte_address) >> 2) % kLanes];
  wave_barrier->arrive_and_wait();
  return got;
}

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
  int last = -1;  // y from -1 to two past the last tile
  while (walk_tile<BM>(p, last + 1).group >= 0) ++last;
  const int ys = last + 4;
  std::barrier<> barrier(kLanes);
  wave_barrier = &barrier;
  std::vector<GroupTile> got(size_t(kLanes) * ys);
  std::vector<std::thread> threads;
  for (int t = 0; t < kLanes; ++t)
    threads.emplace_back([&, t] {
      workitem = kLanes + t;  // the workgroup's second wavefront
      for (int i = 0; i < ys; ++i) got[size_t(t) * ys + i] = contiguous_tile<BM>(p, i - 1);
    });
  for (auto& t : threads) t.join();
  for (int t = 0; t < kLanes; ++t)
    for (int i = 0; i < ys; ++i) {
      const GroupTile a = got[size_t(t) * ys + i], b = walk_tile<BM>(p, i - 1);
      if (a.group != b.group || a.row0 != b.row0 || a.row_end != b.row_end) {
        std::printf("mismatch BM %d y %d lane %d: %d %d %d, the walk %d %d %d\n", BM, i - 1, t, a.group, a.row0,
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
    const int tiles32 = check<32>(p), tiles128 = tiles32 < 0 ? -1 : check<128>(p);  // Cfg32, Cfg128
    std::printf("tiles %d %d\n", tiles32, tiles128);
  }
}
"""


@pytest.fixture(scope="module")
def run_lookup(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("gfx942_contiguous_tile")
    csrc = ROOT / "packages" / "fp8gemm-rocm-gfx942" / "csrc"
    core_include = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"
    (out / "hip").mkdir()
    (out / "hip" / "hip_runtime.h").write_text(HIP_RUNTIME)
    (out / "driver.cpp").write_text(DRIVER)
    includes = [f"-I{folder}" for folder in (out, csrc, core_include)]  # out: the shim's hip/hip_runtime.h
    build = [cxx, "-std=c++20", "-O1", "-pthread", "-DFP8GEMM_HIP_HEADERS", *includes]
    subprocess.run([*build, str(out / "driver.cpp"), "-o", str(out / "driver")], check=True)

    def run(ends: list[int], m: int) -> tuple[int, int]:
        text = f"{len(ends)} {m}\n{' '.join(map(str, ends))}\n"
        result = subprocess.run([str(out / "driver")], input=text, capture_output=True, text=True, check=True)
        line = result.stdout.strip().splitlines()[-1]
        assert line.startswith("tiles ") and "-1" not in line.split(), result.stdout
        return tuple(map(int, line.split()[1:]))

    return run


@pytest.mark.parametrize("ends,m", [(e, m) for _, e, m in NAMED], ids=[name for name, _, _ in NAMED])
def test_many_groups_as_the_walk(run_lookup, ends, m):
    assert run_lookup(ends, m) == (len(walk(ends, m, 32)), len(walk(ends, m, 128)))


@settings(max_examples=15, deadline=None)
@given(
    groups=st.integers(1, 700),
    rows=st.integers(0, 300),
    spoiled=st.integers(0, 12),
    tail=st.sampled_from([0, 0, 9]),
    seed=st.integers(0, 2**20),
)
def test_drawn_splits_as_the_walk(run_lookup, groups, rows, spoiled, tail, seed):
    rng = random.Random(seed)
    ends, m = decode_ends(groups, rows, rng)
    run_lookup(spoil(ends, m + tail, rng, spoiled), m + tail)


def _kernel_problems() -> list[Problem]:
    rng = random.Random(942)
    decode, decode_m = decode_ends(300, 24, rng)
    late, late_m = [0] * 256 + decode_ends(344, 150, rng)[0], 155  # rows only in groups past the first 256
    late[590], late[591], late[595] = INT_MAX, 3, -7  # past m, then decreasing and negative: all clamped to m
    return [
        Problem("decode-300-groups", False, decode_m, 16, 128, tuple(decode), seed=4700),
        Problem("600-groups-rows-past-the-first-256", False, late_m, 16, 128, tuple(late), seed=4701),
        Problem("257-groups-128-row-tiles", False, 257, 16, 128, tuple(range(1, 258)), expected_m=200, seed=4702),
    ]


KERNEL_PROBLEMS = _kernel_problems()


@pytest.mark.parametrize("problem", KERNEL_PROBLEMS, ids=[p.id for p in KERNEL_PROBLEMS])
def test_the_kernel_with_many_groups(problem, emulator, mi300x):
    print(f"{problem.id}: seed {problem.seed}, {problem.groups} groups, m {problem.m}")
    x, buffer = launch_once(emulator, mi300x, problem, torch.bfloat16)
    check(problem, x, buffer, torch.bfloat16)


def test_the_kernel_problems_hold_what_they_name():
    """A test of the test data: rows in groups of a second and a third step of 256, an end past m, decreasing after."""
    late = {p.id: p for p in KERNEL_PROBLEMS}["600-groups-rows-past-the-first-256"]
    ranges = late.row_ranges()
    with_rows = [g for g, (b, e) in enumerate(ranges) if e > b]
    assert min(with_rows) >= 256 and max(with_rows) == 590 and any(g >= 512 for g in with_rows[:-1])
    assert ranges[590][1] == late.m and ranges[591] == ranges[595] == (late.m, late.m)
