"""fp8gemm-rocm-gfx942's contiguous grouped layout (``offs``) with many groups, two ways without a GPU.

csrc/contiguous_tile.hpp, where each wavefront finds the group of its workgroup's row tile from the group ends with
cross-lane reads, built with the host compiler over a small shim (one std::thread per work-item of a 64-lane
wavefront, ds_bpermute through an exchange, as the CPU emulator's build takes it: no readlane) and run for every row
tile y (and -1, and past the last tile) of both tile heights: every lane must return what a walk of the groups one at
a time returns (the function it replaced, in the driver), bit for bit, on the cases of
tests/contiguous_tile_driver.py (up to 700 groups, mostly empty, ends that decrease, pass m or are negative).
Then the grouped kernel itself (csrc/grouped.hip) on the CPU emulator with hundreds of groups, each against a float64
oracle (test_gfx942_emulation_grouped's checks: rows outside every group stay NaN)."""

from __future__ import annotations

import random

import pytest
import test_gfx942_emulation
import torch
from contiguous_tile_driver import INT_MAX, build_driver, decode_ends, drawn_split, drawn_splits, named_splits, walk
from hypothesis import given, settings
from isa import ROOT
from test_gfx942_emulation_grouped import Problem, check, launch_once

emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run

HEIGHTS = (32, 128)  # Cfg32, Cfg128

HIP_RUNTIME = r"""
// The few HIP names csrc/contiguous_tile.hpp uses, on host threads (the driver defines them).
#pragma once
#define __device__
int emulated_bpermute(int byte_address, int value);
unsigned emulated_workitem_id();
#define __builtin_amdgcn_ds_bpermute(address, value) emulated_bpermute((address), (value))
#define __builtin_amdgcn_workitem_id_x() emulated_workitem_id()
"""

SHIM = r"""
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

constexpr int kThreads = kLanes;  // one wavefront
constexpr char kThreadName[] = "lane";
void start_threads() { wave_barrier = new std::barrier<>(kLanes); }
void enter_thread(int t) { workitem = kLanes + t; }  // the workgroup's second wavefront
void end_threads() { delete wave_barrier; }
"""


@pytest.fixture(scope="module")
def run_lookup(tmp_path_factory):
    out = tmp_path_factory.mktemp("gfx942_contiguous_tile")
    csrc = ROOT / "packages" / "fp8gemm-rocm-gfx942" / "csrc"
    headers = {"hip/hip_runtime.h": HIP_RUNTIME}
    return build_driver(out, SHIM, HEIGHTS, csrc, flags=["-DFP8GEMM_HIP_HEADERS"], headers=headers)


@named_splits
def test_many_groups_as_the_walk(run_lookup, ends, m):
    assert run_lookup(ends, m) == (len(walk(ends, m, 32)), len(walk(ends, m, 128)))


@settings(max_examples=15, deadline=None)
@given(**drawn_splits(max_rows=300))
def test_drawn_splits_as_the_walk(run_lookup, groups, rows, spoiled, tail, seed):
    run_lookup(*drawn_split(groups, rows, spoiled, tail, seed))


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
