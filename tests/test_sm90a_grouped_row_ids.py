"""fp8gemm-cuda-sm90a's row-ids layout (grouped_gemm with m_indices) without a GPU: the run warp's scan
(csrc/row_runs.hpp scan_row_runs, the body of csrc/run_ring.cuh scan_runs) and the tile walk over its runs
(csrc/group_cursor.hpp seek_runs) are plain C++, so a driver built with the host compiler runs the scan's own source on
32 threads, one per lane (tests/host_warp.py), then the persistent grid's walk, every CTA taking every run in order as
on the device. The runs, with pieces of long runs joined, must be the maximal stretches of one id in [0, G); every row
of such a run is stored by exactly one tile per N block, no -1 row (or id outside [0, G)) by any, and rows sorted by
expert take exactly the tiles that the same groups take through ``offs``."""

from __future__ import annotations

import random

import pytest
from host_warp import HOST_WARP, build_threaded_driver
from hypothesis import given, settings
from hypothesis import strategies as st

DRIVER = (
    HOST_WARP
    + r"""
#include "heuristics.hpp"
struct Walk { const int32_t* group_rows; int groups, masked, m, n_blocks; };

// The run warp's scan (run_ring.cuh scan_runs): the runs in run-number order, then the end from lane 0.
std::vector<RowRun> scan(const std::vector<int32_t>& ids, int groups) {
  const Walk w{ids.data(), groups, 0, static_cast<int>(ids.size()), 0};
  const auto puts = run_lanes(ids.data(), static_cast<int>(ids.size()),
                              [&](int l, auto put_run) { scan_row_runs<HostWarp>(w, l, put_run); });
  std::vector<RowRun> runs;
  for (size_t i = 0; i < puts.size(); ++i) {
    if (puts[i].n != static_cast<int>(i)) std::_Exit(4);  // each run number once: the ring's slots in turn
    runs.push_back(puts[i].run);
  }
  if (runs.empty() || runs.back().id != -1 || puts.back().lane != 0) std::_Exit(5);  // the end, from lane 0, last
  runs.pop_back();
  return runs;
}

template <int kBlockM, int kPairs>
void walk(const Walk& w, const std::vector<RowRun>& runs, int grid, bool row_ids, long long count) {
  for (int cluster = 0; cluster < grid / kPairs; ++cluster) {
    for (int rank = 0; rank < kPairs; ++rank) {
      GroupCursor<kBlockM, kPairs> cursor;
      size_t taken = 0;
      auto next = [&] { return taken < runs.size() ? runs[taken++] : RowRun{0, 0, -1}; };
      for (long long t = cluster; t < count; t += grid / kPairs) {
        if (!(row_ids ? cursor.seek_runs(w, static_cast<int>(t), next) : cursor.seek(w, static_cast<int>(t)))) break;
        const auto g = cursor.tile(w, static_cast<int>(t));
        std::printf("%d %d %d %d %d %d\n", g.group, g.m_block, g.n_block * kPairs + rank, g.row0, g.lo, g.hi);
      }
    }
  }
}

int main() {
  int row_ids, groups, count_rows, sms; long long m, n, k;
  while (std::scanf("%d %d %lld %lld %lld %d %d", &row_ids, &groups, &m, &n, &k, &sms, &count_rows) == 7) {
    std::vector<int32_t> rows(count_rows);  // row ids: m of them; offs: groups of them
    for (auto& r : rows) std::scanf("%d", &r);
    const auto runs = row_ids ? scan(rows, groups) : std::vector<RowRun>{};
    for (const auto& r : runs) std::printf("run %d %d %d\n", r.begin, r.end, r.id);
    const auto p = grouped_plan_for(false, m, n, k, groups, 0, sms, row_ids);
    std::printf("plan %d %d %lld %lld %lld\n", p.tile.rows, p.tile.cluster, (long long)p.row_tiles,
                (long long)p.n_blocks, (long long)p.grid);
    const Walk w{rows.data(), groups, 0, static_cast<int>(m), static_cast<int>(p.n_blocks)};
    const long long pairs = p.tile.cluster, bound = p.row_tiles * ((p.n_blocks + pairs - 1) / pairs);
    const long long count = row_ids ? 0x7fffffffLL : bound;  // scheduler.cuh tile_walk: the runs end the walk
    if (p.tile.rows == 64) walk<64, 1>(w, runs, p.grid, row_ids, count);
    else if (p.tile.rows == 128) walk<128, 1>(w, runs, p.grid, row_ids, count);
    else if (p.tile.rows == 192) walk<192, 1>(w, runs, p.grid, row_ids, count);
    else if (pairs == 2) walk<256, 2>(w, runs, p.grid, row_ids, count);
    else walk<256, 1>(w, runs, p.grid, row_ids, count);
    std::printf("end\n");
  }
}
"""
)


@pytest.fixture(scope="module")
def run_walk(tmp_path_factory):
    driver = build_threaded_driver(tmp_path_factory.mktemp("sm90a_row_ids"), DRIVER)

    def run(row_ids: bool, rows: list[int], groups: int, m: int, n: int, k: int = 7168, sms: int = 132):
        text = f"{int(row_ids)} {groups} {m} {n} {k} {sms} {len(rows)}\n{' '.join(map(str, rows))}\n"
        lines = driver(text).splitlines()
        assert lines[-1] == "end"
        runs = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("run ")]
        (plan_line,) = [line for line in lines if line.startswith("plan ")]
        block, cluster, row_tiles, n_blocks, grid = map(int, plan_line.split()[1:])
        plan = dict(rows=block, cluster=cluster, row_tiles=row_tiles, n_blocks=n_blocks, grid=grid)
        tiles = [tuple(map(int, line.split())) for line in lines[len(runs) + 1 : -1]]
        return runs, plan, tiles

    return run


PIECE_ALIGN, PIECE_ROWS = 768, 1536  # csrc/row_runs.hpp kRunPieceAlign, kRunPieceRows


def joined(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The runs with each piece joined to the run it continues (same id, next row)."""
    out: list[tuple[int, int, int]] = []
    for begin, end, group in runs:
        if out and out[-1][1] == begin and out[-1][2] == group:
            out[-1] = (out[-1][0], end, group)
        else:
            out.append((begin, end, group))
    return out


def check_pieces(runs: list[tuple[int, int, int]]):
    """Each piece but a run's last ends a whole multiple of 768 rows (at least 1536) past its 4-row-aligned start,
    so it takes exactly the tiles of the whole run."""
    for (begin, end, group), after in zip(runs, runs[1:], strict=False):  # each run with the one after it
        if after[0] == end and after[2] == group:
            whole = end - (begin & ~3)
            assert whole % PIECE_ALIGN == 0 and whole >= PIECE_ROWS, (begin, end)


def reference_runs(ids: list[int], groups: int) -> list[tuple[int, int, int]]:
    """The maximal stretches of one id, in row order, of ids in [0, groups)."""
    runs, start = [], 0
    for row in range(1, len(ids) + 1):
        if row == len(ids) or ids[row] != ids[start]:
            if 0 <= ids[start] < groups:
                runs.append((start, row, ids[start]))
            start = row
    return runs


def check_row_ids(run_walk, ids: list[int], groups: int, n: int, sms: int = 132):
    m = len(ids)
    runs, plan, tiles = run_walk(True, ids, groups, m, n, sms=sms)
    assert joined(runs) == reference_runs(ids, groups)
    check_pieces(runs)
    assert 1 <= plan["grid"] <= sms and plan["grid"] % plan["cluster"] == 0
    block, stored = plan["rows"], set()
    for group, _, n_block, row0, lo, hi in tiles:
        if n_block >= plan["n_blocks"]:  # a cluster's padding N block past N: never stored
            assert plan["n_blocks"] % plan["cluster"] and n_block == plan["n_blocks"]
            continue
        assert 0 <= lo < hi <= m and all(ids[r] == group for r in range(lo, hi)), (group, lo, hi)
        assert row0 % 4 == 0 and 0 <= row0 <= lo and hi <= row0 + block  # the load covers what is stored
        assert row0 + block <= max(m, block) + 3  # inside A (a tile taller than A loads a box of A's rows)
        for row in range(lo, hi):
            assert (row, n_block) not in stored, f"row {row} stored twice"
            stored.add((row, n_block))
    want = {(r, nb) for r in range(m) if 0 <= ids[r] < groups for nb in range(plan["n_blocks"])}
    assert stored == want  # every row of an expert, no -1 row nor any id outside [0, G)
    # The device's bound on tile indices (check_grouped_tiles): the walk's last t stays below it.
    assert len(tiles) <= plan["row_tiles"] * -(-plan["n_blocks"] // plan["cluster"]) * plan["cluster"]
    return plan, tiles


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    pad=st.sampled_from([0, 1, 128]),
    n=st.sampled_from([128, 256, 640, 4096]),
    sms=st.sampled_from([1, 3, 132]),
)
def test_sorted_ids_take_the_tiles_of_offs(run_walk, sizes, pad, n, sms):
    """Rows sorted by expert (pad 0), or each group padded with -1 to a multiple of `pad` (DeepGEMM's layout)."""
    ids = []
    for g, size in enumerate(sizes):
        ids += [g] * size + [-1] * ((-size % pad) if pad > 1 else 0)
    if not ids:
        ids = [-1]
    _, row_tiles = check_row_ids(run_walk, ids, len(sizes), n, sms)
    if pad == 0 and sum(sizes):  # the same groups through offs: the same tiles
        ends = [sum(sizes[: g + 1]) for g in range(len(sizes))]
        _, _, offs_tiles = run_walk(False, ends, len(sizes), len(ids), n, sms=sms)
        assert without_m_block(row_tiles) == without_m_block(offs_tiles)


def without_m_block(tiles):
    """Tiles as (group, n block, first row loaded, rows stored): a piece numbers its row tiles from its own start."""
    return sorted((group, n_block, row0, lo, hi) for group, _, n_block, row0, lo, hi in tiles)


@pytest.mark.parametrize(
    "sizes", [[35248, 401, 2046], [401, 35248], [1535, 1537, 3 * 768 + 1], [0, 5000, 0, 7], [20000]]
)
@pytest.mark.parametrize("pad", [0, 1, 128])
def test_long_runs_go_out_in_pieces_that_take_the_tiles_of_offs(run_walk, sizes, pad):
    """Runs longer than a piece (the largest expert first, as in the slowest routing measured) go out while the scan is
    inside them; sorted rows still take the tiles `offs` gives the same groups."""
    ids = []
    for g, size in enumerate(sizes):
        ids += [g] * size + [-1] * ((-size % pad) if pad > 1 else 0)
    runs, _, _ = run_walk(True, ids, len(sizes), len(ids), 4096)
    assert len(runs) > len(reference_runs(ids, len(sizes)))  # some run went out in pieces
    _, row_tiles = check_row_ids(run_walk, ids, len(sizes), 4096)
    if pad == 0:
        ends = [sum(sizes[: g + 1]) for g in range(len(sizes))]
        _, _, offs_tiles = run_walk(False, ends, len(sizes), len(ids), 4096)
        assert without_m_block(row_tiles) == without_m_block(offs_tiles)


def test_deepgemm_layout_takes_whole_tiles(run_walk):
    """Each expert's rows from a multiple of 128, padded with -1: every tile of 128 rows is whole."""
    sizes = [256, 130, 0, 1, 384]
    ids = []
    for g, size in enumerate(sizes):
        ids += [g] * size + [-1] * (-size % 128)
    plan, tiles = check_row_ids(run_walk, ids, len(sizes), 4096)
    if plan["rows"] == 128:
        assert all(row0 % 128 == 0 and lo == row0 for _, _, _, row0, lo, _ in tiles)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 700),
    groups=st.integers(1, 9),
    minus=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
    n=st.sampled_from([128, 384, 4096]),
    sms=st.sampled_from([1, 5, 132]),
)
def test_any_order_stores_every_expert_row_once(run_walk, m, groups, minus, seed, n, sms):
    rng = random.Random(seed)
    ids = [-1 if rng.random() < minus else rng.randrange(groups) for _ in range(m)]
    check_row_ids(run_walk, ids, groups, n, sms)


@pytest.mark.parametrize(
    "ids",
    [
        [0] * 31 + [1] * 2 + [0] * 31,  # runs across chunk ends
        [2] * 64,  # one run ending on a chunk end
        [0, 1] * 80,  # a run a row
        [-1] * 32 + [1] * 33,
        [7, -3, 0, 0, 5, 1, 1, 2**31 - 1, 1],  # ids outside [0, G): no tiles, not written
        [0],
    ],
)
def test_runs_at_chunk_edges_and_ids_outside_the_experts(run_walk, ids):
    check_row_ids(run_walk, ids, 3, 256)
