"""fp8gemm-cuda-sm90a's grouped kernels without a GPU: their plan (csrc/heuristics.hpp grouped_plan_for), the run
warp's scan of the groups (csrc/row_runs.hpp scan_group_ends, the body of csrc/run_ring.cuh scan_groups) and the tile
walk over its runs (csrc/group_cursor.hpp seek_runs) are plain C++. A driver built with the host compiler runs the
scan's own source on 32 threads, one per lane (its shuffles, ballots and __syncwarp through a std::barrier, each lane's
put_run recorded instead of stored in the ring), then the persistent grid's walk over the runs it handed out (every
CTA with its own cursor, as on the device), for group splits that hypothesis draws. The runs must be numbered 0, 1, ...
and be the groups with rows as GroupCursor::next_group clamps them, then lane 0's end; every row of every group must be
stored by exactly one tile per N block, no tile may store another group's rows, and every load must lie inside A (rows
from a 4-row boundary) and cover the rows its tile stores."""

from __future__ import annotations

import random

import pytest
from contiguous_tile_driver import decode_ends, drawn_splits, named_splits, spoil
from host_warp import HOST_WARP, build_threaded_driver
from hypothesis import assume, given, settings
from hypothesis import strategies as st

DRIVER = (
    HOST_WARP
    + r"""
#include "heuristics.hpp"
struct Walk { const int32_t* group_rows; int groups, masked, m, n_blocks; };

std::vector<Put> scan(const Walk& w) {
  return run_lanes(w.group_rows, w.groups, [&](int l, auto put_run) { scan_group_ends<HostWarp>(w, l, put_run); });
}

template <int kBlockM, int kPairs>
void walk(const Walk& w, const std::vector<RowRun>& runs, int grid, long long count) {
  for (int cluster = 0; cluster < grid / kPairs; ++cluster) {  // each CTA's own cursor, stepping by the clusters
    for (int rank = 0; rank < kPairs; ++rank) {
      GroupCursor<kBlockM, kPairs> cursor;
      size_t taken = 0;
      auto next = [&] { return taken < runs.size() ? runs[taken++] : RowRun{0, 0, -1}; };
      for (long long t = cluster; t < count; t += grid / kPairs) {
        if (!cursor.seek_runs(w, static_cast<int>(t), next)) break;
        const auto g = cursor.tile(w, static_cast<int>(t));
        std::printf("%d %d %d %d %d %d\n", g.group, g.m_block, g.n_block * kPairs + rank, g.row0, g.lo, g.hi);
      }
    }
  }
}
int main() {
  int masked, groups, sms; long long m, n, k, expected;
  while (std::scanf("%d %d %lld %lld %lld %lld %d", &masked, &groups, &m, &n, &k, &expected, &sms) == 7) {
    std::vector<int32_t> rows(groups);
    for (auto& r : rows) std::scanf("%d", &r);
    const auto p = fp8gemm_sm90a::grouped_plan_for(masked, m, n, k, groups, expected, sms);
    std::printf("plan %d %d %d %d %d %lld %lld %lld\n", p.tile.rows, p.tile.cols, p.tile.cluster, (int)p.tile.loop,
                (int)(fp8gemm_sm90a::grouped_tile_index(p.tile) >= 0), (long long)p.row_tiles,
                (long long)p.n_blocks, (long long)p.grid);
    const Walk w{rows.data(), groups, masked, static_cast<int>(m), static_cast<int>(p.n_blocks)};
    std::vector<RowRun> runs;  // as the roles take them from the ring: in run-number order, the end last
    for (const auto& put : scan(w)) {
      std::printf("put %d %d %d %d %d\n", put.n, put.lane, put.run.begin, put.run.end, put.run.id);
      runs.push_back(put.run);
    }
    GroupCursor<64, 1> one_at_a_time;  // the definition: next_group over every group
    for (RowRun r = one_at_a_time.next_group(w); r.id >= 0; r = one_at_a_time.next_group(w)) {
      one_at_a_time.group = r.id, one_at_a_time.end = r.end;
      if (r.end > r.begin) std::printf("group %d %d %d\n", r.begin, r.end, r.id);
    }
    // The device's walk has no bound (the runs end it); the host's bound is checked by the caller.
    const long long pairs = p.tile.cluster, count = 1LL << 40;
    if (p.tile.rows == 64) walk<64, 1>(w, runs, p.grid, count);
    else if (p.tile.rows == 128) walk<128, 1>(w, runs, p.grid, count);
    else if (p.tile.rows == 192) walk<192, 1>(w, runs, p.grid, count);
    else if (pairs == 2) walk<256, 2>(w, runs, p.grid, count);
    else walk<256, 1>(w, runs, p.grid, count);
    std::printf("end\n");
  }
}
"""
)


@pytest.fixture(scope="module")
def run_walk(tmp_path_factory):
    driver = build_threaded_driver(tmp_path_factory.mktemp("sm90a_grouped"), DRIVER)

    def run(masked: bool, group_rows: list[int], m: int, n: int, k: int = 7168, expected: int = 0, sms: int = 132):
        text = f"{int(masked)} {len(group_rows)} {m} {n} {k} {expected} {sms}\n{' '.join(map(str, group_rows))}\n"
        lines = driver(text).splitlines()
        assert lines[0].startswith("plan") and lines[-1] == "end"
        rows, cols, cluster, loop, compiled, row_tiles, n_blocks, grid = map(int, lines[0].split()[1:])
        plan = dict(rows=rows, cols=cols, cluster=cluster, loop=loop, compiled=compiled, row_tiles=row_tiles,
                    n_blocks=n_blocks, grid=grid)  # fmt: skip
        puts = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("put ")]
        groups = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("group ")]
        assert [put[0] for put in puts] == list(range(len(puts)))  # each run number once: the ring's slots in turn
        assert puts[-1][1:] == (0, 0, 0, -1)  # the end, from lane 0, after every run
        assert [put[2:] for put in puts[:-1]] == groups  # exactly the groups with rows, in order
        tiles = [tuple(map(int, line.split())) for line in lines[1:-1] if line[0].isdigit() or line[0] == "-"]
        return plan, tiles

    return run


def group_ranges(masked: bool, group_rows: list[int], m: int) -> list[tuple[int, int]]:
    """Each group's rows as the kernel clamps them: contiguous [previous end, m], masked [0, M_max]."""
    ranges, end = [], 0
    for rows in group_rows:
        begin = 0 if masked else end
        end = min(max(rows, begin), m)
        ranges.append((begin, end))
    return ranges


def check_walk(run_walk, masked: bool, group_rows: list[int], m: int, n: int, expected: int = 0, sms: int = 132):
    plan, tiles = run_walk(masked, group_rows, m, n, expected=expected, sms=sms)
    assert plan["compiled"], plan
    assert 1 <= plan["grid"] <= sms and plan["grid"] % plan["cluster"] == 0
    assert plan["n_blocks"] == -(-n // plan["cols"]) and plan["n_blocks"] >= plan["cluster"]
    block, pairs = plan["rows"], plan["cluster"]
    ranges = group_ranges(masked, group_rows, m)
    stored = {}
    for group, _, n_block, row0, lo, hi in tiles:
        if n_block >= plan["n_blocks"]:  # a cluster's padding N block past N: its columns are never stored
            assert plan["n_blocks"] % pairs and n_block == plan["n_blocks"]
            continue
        begin, end = ranges[group]
        assert begin <= lo < hi <= end, (group, lo, hi, begin, end)  # its own group's rows, at least one
        assert row0 % 4 == 0 and 0 <= row0 <= lo and hi <= row0 + block  # the load covers what is stored
        assert row0 + block <= max(m, block) + 3  # inside A (a tile taller than A loads a box of A's rows)
        assert 0 <= n_block < plan["n_blocks"]
        for row in range(lo, hi):
            key = (group, row, n_block)
            assert key not in stored, f"row {row} of group {group} stored twice"
            stored[key] = True
    want = {(g, r, nb) for g, (b, e) in enumerate(ranges) for r in range(b, e)
            for nb in range(plan["n_blocks"])}  # fmt: skip
    assert set(stored) == want
    assert len(tiles) <= plan["row_tiles"] * -(-plan["n_blocks"] // pairs) * pairs
    return plan


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    tail=st.integers(0, 7),
    n=st.sampled_from([128, 256, 384, 640, 4096]),
    sms=st.sampled_from([1, 3, 132]),
)
def test_contiguous_walk_stores_every_row_once(run_walk, sizes, tail, n, sms):
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assume(ends[-1] + tail > 0)  # no rows: the launch returns before planning
    check_walk(run_walk, False, ends, ends[-1] + tail, n, sms=sms)  # rows past offs[-1] belong to no group


@settings(max_examples=60, deadline=None)
@given(data=st.data(), m_max=st.integers(1, 600), groups=st.integers(1, 10), n=st.sampled_from([128, 512, 7168]))
def test_masked_walk_stores_every_row_below_masked_m_once(run_walk, data, m_max, groups, n):
    masked_m = data.draw(st.lists(st.integers(0, m_max), min_size=groups, max_size=groups))
    expected = data.draw(st.sampled_from([0, 1, 64, m_max]))
    check_walk(run_walk, True, masked_m, m_max, n, expected=expected)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), groups=st.integers(33, 600), masked=st.booleans())
def test_many_mostly_empty_groups_cross_the_warps_chunks(run_walk, data, groups, masked):
    # Decode: a few of hundreds of experts hold rows; the scan's chunks of 32 and batches of 256 groups meet them.
    hit = data.draw(st.lists(st.integers(0, groups - 1), min_size=1, max_size=9))
    counts = [hit.count(g) * data.draw(st.integers(1, 70)) for g in range(groups)]
    if masked:
        check_walk(run_walk, True, counts, max(counts), 512)
    else:
        ends = [sum(counts[: g + 1]) for g in range(groups)]
        check_walk(run_walk, False, ends, ends[-1], 512)


def test_out_of_range_group_rows_are_clamped(run_walk):
    # A buggy router's values: decreasing ends, ends past M, negative counts; the walk stays inside A.
    check_walk(run_walk, False, [40, 10, 10_000, -5, 70], 64, 256)
    check_walk(run_walk, True, [-3, 10_000, 17], 100, 256)


@named_splits
def test_named_splits_over_hundreds_of_groups(run_walk, ends, m):
    # tests/contiguous_tile_driver.py's cases: up to 700 groups (the scan's batches of 256), mostly empty, with ends
    # that decrease, pass m, are negative or the int extremes; contiguous, and the same values as masked_m where their
    # rows stay few enough to check one by one.
    check_walk(run_walk, False, ends, m, 256)
    if sum(min(max(rows, 0), m) for rows in ends) <= 20_000:
        check_walk(run_walk, True, ends, m, 256)


@settings(max_examples=30, deadline=None)
@given(**drawn_splits(max_rows=400), masked=st.booleans())
def test_spoiled_values_over_many_groups(run_walk, groups, rows, spoiled, tail, seed, masked):
    # A decode batch over up to 700 groups, up to 12 values replaced by a buggy router's: decreasing, past m, negative,
    # the int extremes. Contiguous: cumulative ends; masked: rows per group.
    rng = random.Random(seed)
    ends, m = decode_ends(groups, rows, rng)
    values = [end - before for before, end in zip([0, *ends[:-1]], ends, strict=True)] if masked else ends
    check_walk(run_walk, masked, spoil(values, m + tail, rng, spoiled), m + tail, 512)


@pytest.mark.parametrize(
    ("masked", "rows_per_group", "groups", "n", "want_rows"),
    [(True, 8, 32, 4096, 64), (False, 64, 32, 4096, 64), (False, 4096, 8, 4096, 256)],
)
def test_plan_picks_decode_tiles_for_small_groups(run_walk, masked, rows_per_group, groups, n, want_rows):
    rows = [rows_per_group] * groups if masked else [rows_per_group * (g + 1) for g in range(groups)]
    plan, _ = run_walk(masked, rows, rows_per_group * (1 if masked else groups), n)
    assert plan["rows"] == want_rows, plan
