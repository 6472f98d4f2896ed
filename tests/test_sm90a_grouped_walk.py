"""fp8gemm-cuda-sm90a's grouped kernels without a GPU: their plan (csrc/heuristics.hpp grouped_plan_for), the run
warp's scan of the groups (csrc/run_ring.cuh scan_groups, its per-lane arithmetic in csrc/row_runs.hpp) and the tile
walk over its runs (csrc/group_cursor.hpp seek_runs) are plain C++, so a driver built with the host compiler runs the
warp 32 groups at a time (its shuffles and ballots as loops), then the persistent grid's walk (every CTA with its own
cursor, as on the device), for group splits that hypothesis draws. The runs must be the groups with rows as
GroupCursor::next_group clamps them, every row of every group must be stored by exactly one tile per N block, no tile
may store another group's rows, and every load must lie inside A (rows from a 4-row boundary) and cover the rows its
tile stores."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from isa import sm90a_host_driver

DRIVER = r"""
#include <cstdio>
#include <vector>
#include "heuristics.hpp"
#include "row_runs.hpp"
using namespace fp8gemm_sm90a;
struct Walk { const int32_t* group_rows; int groups, masked, m, n_blocks; };

// The run warp of run_ring.cuh scan_groups, 32 groups at a time; its shuffle scan and ballot as loops.
std::vector<RowRun> scan(const Walk& w) {
  std::vector<RowRun> runs;
  int carry = 0, emitted = 0;
  for (int base = 0; base < w.groups; base += 32) {
    int begin[32] = {}, end[32];
    uint32_t emits = 0;
    for (int l = 0; l < 32; ++l) end[l] = clamped_rows(base + l < w.groups ? w.group_rows[base + l] : 0, w.m);
    if (!w.masked) {
      for (int l = 0; l < 32; ++l) end[l] = std::max(end[l], l ? end[l - 1] : carry);
      for (int l = 0; l < 32; ++l) begin[l] = l ? end[l - 1] : carry;
      carry = end[31];
    }
    for (int l = 0; l < 32; ++l) emits |= uint32_t(base + l < w.groups && end[l] > begin[l]) << l;
    runs.resize(emitted + bit_count(emits));
    for (int l = 0; l < 32; ++l)
      if (emits >> l & 1) runs[run_number(emits, l, emitted)] = RowRun{begin[l], end[l], base + l};
    emitted += bit_count(emits);
  }
  return runs;
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
    const auto runs = scan(w);
    for (const auto& r : runs) std::printf("run %d %d %d\n", r.begin, r.end, r.id);
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


@pytest.fixture(scope="module")
def run_walk(tmp_path_factory):
    driver = sm90a_host_driver(tmp_path_factory.mktemp("sm90a_grouped"), DRIVER)

    def run(masked: bool, group_rows: list[int], m: int, n: int, k: int = 7168, expected: int = 0, sms: int = 132):
        text = f"{int(masked)} {len(group_rows)} {m} {n} {k} {expected} {sms}\n{' '.join(map(str, group_rows))}\n"
        lines = driver(text).splitlines()
        assert lines[0].startswith("plan") and lines[-1] == "end"
        rows, cols, cluster, loop, compiled, row_tiles, n_blocks, grid = map(int, lines[0].split()[1:])
        plan = dict(rows=rows, cols=cols, cluster=cluster, loop=loop, compiled=compiled, row_tiles=row_tiles,
                    n_blocks=n_blocks, grid=grid)  # fmt: skip
        runs = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("run ")]
        groups = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("group ")]
        assert runs == groups  # the warp's scan hands out exactly the groups with rows, in order
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
    stored = {}
    for group, _, n_block, row0, lo, hi in tiles:
        if n_block >= plan["n_blocks"]:  # a cluster's padding N block past N: its columns are never stored
            assert plan["n_blocks"] % pairs and n_block == plan["n_blocks"]
            continue
        begin, end = group_ranges(masked, group_rows, m)[group]
        assert begin <= lo < hi <= end, (group, lo, hi, begin, end)  # its own group's rows, at least one
        assert row0 % 4 == 0 and 0 <= row0 <= lo and hi <= row0 + block  # the load covers what is stored
        assert row0 + block <= max(m, block) + 3  # inside A (a tile taller than A loads a box of A's rows)
        assert 0 <= n_block < plan["n_blocks"]
        for row in range(lo, hi):
            key = (group, row, n_block)
            assert key not in stored, f"row {row} of group {group} stored twice"
            stored[key] = True
    want = {(g, r, nb) for g, (b, e) in enumerate(group_ranges(masked, group_rows, m)) for r in range(b, e)
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


@pytest.mark.parametrize(
    ("masked", "rows_per_group", "groups", "n", "want_rows"),
    [(True, 8, 32, 4096, 64), (False, 64, 32, 4096, 64), (False, 4096, 8, 4096, 256)],
)
def test_plan_picks_decode_tiles_for_small_groups(run_walk, masked, rows_per_group, groups, n, want_rows):
    rows = [rows_per_group] * groups if masked else [rows_per_group * (g + 1) for g in range(groups)]
    plan, _ = run_walk(masked, rows, rows_per_group * (1 if masked else groups), n)
    assert plan["rows"] == want_rows, plan
