"""What tests/test_sm120_grouped_contiguous_tile.py and tests/test_gfx942_grouped_contiguous_tile.py share: a host
build of an arch package's contiguous_tile header (the row tile's group found by each warp or wavefront from the group
ends) over the test's shim, run on one thread per lane for every row tile y (and -1, and past the last tile) of two
tile heights, each thread's result against a walk of the groups one at a time (the function the header replaced), bit
for bit; and the cases: up to 700 groups, mostly empty, with ends that decrease, pass m or are negative."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import strategies as st
from isa import ROOT, require_tool

INT_MAX, INT_MIN = 2**31 - 1, -(2**31)

CORE_INCLUDE = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"

# Before the test's shim, which defines kThreads, kThreadName, start_threads, enter_thread and end_threads.
DRIVER_HEAD = r"""
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
"""

# After the shim: BM_SMALL and BM_LARGE, the two tile heights, come as -D flags.
DRIVER_BODY = r"""
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
  std::vector<GroupTile> got(size_t(kThreads) * ys);
  std::vector<std::thread> threads;
  start_threads();
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      enter_thread(t);
      for (int i = 0; i < ys; ++i) got[size_t(t) * ys + i] = contiguous_tile<BM>(p, i - 1);
    });
  for (auto& t : threads) t.join();
  end_threads();
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < ys; ++i) {
      const GroupTile a = got[size_t(t) * ys + i], b = walk_tile<BM>(p, i - 1);
      if (a.group != b.group || a.row0 != b.row0 || a.row_end != b.row_end) {
        std::printf("mismatch BM %d y %d %s %d: %d %d %d, the walk %d %d %d\n", BM, i - 1, kThreadName, t, a.group,
                    a.row0, a.row_end, b.group, b.row0, b.row_end);
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
    const int small = check<BM_SMALL>(p), large = small < 0 ? -1 : check<BM_LARGE>(p);
    std::printf("tiles %d %d\n", small, large);
  }
}
"""


def build_driver(
    out: Path,
    shim: str,
    heights: tuple[int, int],
    csrc: Path,
    flags: Sequence[str] = (),
    headers: dict[str, str] | None = None,
) -> Callable[[list[int], int], tuple[int, int]]:
    """The driver built in ``out`` over ``shim`` (with ``headers``, relative path: text, written under ``out``);
    returned, a run on one split (cumulative ends, m) that gives the tile count of each height."""
    cxx = require_tool("g++")
    for name, text in (headers or {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    (out / "driver.cpp").write_text(DRIVER_HEAD + shim + DRIVER_BODY)
    includes = [f"-I{folder}" for folder in (out, csrc, CORE_INCLUDE)]  # out: the headers, found first
    tiles = [f"-DBM_SMALL={heights[0]}", f"-DBM_LARGE={heights[1]}"]
    build = [cxx, "-std=c++20", "-O1", "-pthread", *flags, *tiles, *includes]
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
    """``count`` ends replaced by values only the device sees: decreasing, past m, negative, the int extremes (an
    int32 tensor holds nothing beyond them, so a decrease of an end already spoiled stops at INT_MIN)."""
    ends = list(ends)
    for _ in range(count):
        g = rng.randrange(len(ends))
        values = [
            -1,
            INT_MIN,
            INT_MAX,
            m + 1,
            m + rng.randrange(1, 300),
            max(INT_MIN, ends[g] - rng.randrange(1, 90)),
            0,
        ]
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

named_splits = pytest.mark.parametrize("ends,m", [(e, m) for _, e, m in NAMED], ids=[name for name, _, _ in NAMED])


def walk(ends: list[int], m: int, block: int) -> list[tuple[int, int]]:
    """(group, first row) of each row tile, the groups walked in order with their ends clamped to [previous end, m]."""
    tiles, begin = [], 0
    for g, end in enumerate(ends):
        end = min(max(end, begin), m)
        tiles += [(g, row) for row in range(begin, end, block)]
        begin = end
    return tiles


def drawn_splits(max_rows: int) -> dict[str, st.SearchStrategy]:
    """given()'s keywords for drawn_split: up to 700 groups, up to ``max_rows`` rows, up to 12 ends spoiled."""
    return {
        "groups": st.integers(1, 700),
        "rows": st.integers(0, max_rows),
        "spoiled": st.integers(0, 12),
        "tail": st.sampled_from([0, 0, 9]),
        "seed": st.integers(0, 2**20),
    }


def drawn_split(groups: int, rows: int, spoiled: int, tail: int, seed: int) -> tuple[list[int], int]:
    """(ends, m): ``rows`` rows over ``groups`` groups, ``spoiled`` ends spoilt, m ``tail`` past the last end."""
    rng = random.Random(seed)
    ends, m = decode_ends(groups, rows, rng)
    return spoil(ends, m + tail, rng, spoiled), m + tail
