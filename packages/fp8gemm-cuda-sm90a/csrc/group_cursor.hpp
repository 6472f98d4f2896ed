// Grouped kernels' tile walk (scheduler.cuh Tiles): a CTA's cursor over the groups as its tile index grows. Plain
// C++, so tests drive it on the host with the device's arithmetic.
//
// Group g's tiles are its row tiles x the N blocks, after every earlier group's; within a group, panels of 16 row
// tiles, row tiles fastest (as tile_order.hpp). Its row tiles start at its first row rounded down to 4 (a TMA box of
// A scales starts 16-byte aligned), so a tile may load rows of the group before; it stores only [lo, hi). Group ends
// are clamped to [previous end, m] (masked: [0, m]), so no tile reads or writes outside A or out.
// The kernels walk runs (seek_runs): the groups with rows, or the runs of one id in consecutive rows, that the run
// warp hands out (run_ring.cuh, row_runs.hpp), in order, each taking its tiles as a group of the contiguous layout
// does. seek and next_group read the groups one at a time: the definition the run warp's scan reproduces (tests).
#pragma once
#include <cstdint>

#include "tile_order.hpp"

namespace fp8gemm_sm90a {

// A run of rows [begin, end) of one id, `id` in [0, groups); id < 0: no run is left.
struct RowRun {
  int begin, end, id;
};

struct GroupTile {
  int group, m_block, n_block;
  int row0;    // first row the tile loads: at most lo, and row0 + block_m reaches hi or the last row
  int lo, hi;  // the rows it stores (contiguous: rows of A; masked: rows of the group's matrix)
};

FP8GEMM_SM90A_HD int group_rows_at(const int32_t* rows, int g) {
#if defined(__CUDA_ARCH__)
  return __ldg(rows + g);
#else
  return rows[g];
#endif
}

// P: the kernel's Params (group_rows, groups, masked, m: rows of A's view, n_blocks). kPairs: N blocks per tile of
// the walk (2: a 2-CTA cluster's two N blocks of one row tile, so both CTAs share its rows of A).
template <int kBlockM, int kPairs = 1>
struct GroupCursor {
  int group = -1, first_tile = 0, tiles = 0;
  int begin = 0, end = 0, first_row = 0, row_tiles = 0;

  // Moves to the group holding tile t (t never decreases between calls); false past the last group's tiles.
  template <class P>
  FP8GEMM_SM90A_HD bool seek(const P& p, int t) {
    return seek_runs(p, t, [&] { return next_group(p); });
  }

  // The group after the cursor's, its rows clamped; id -1 past the last.
  template <class P>
  FP8GEMM_SM90A_HD RowRun next_group(const P& p) const {
    if (group + 1 >= p.groups) return {0, 0, -1};
    const int rows = group_rows_at(p.group_rows, group + 1), first = p.masked ? 0 : end;
    return {first, rows < first ? first : rows > p.m ? p.m : rows, group + 1};
  }

  // As seek, over the groups next() returns in order (row ids: the runs, each inside A with an id of B; id < 0: no
  // group is left). One walk for every layout: the kernel holds one cursor whichever it runs.
  template <class P, class Next>
  FP8GEMM_SM90A_HD bool seek_runs(const P& p, int t, Next&& next) {
    while (t >= first_tile + tiles) {
      first_tile += tiles, tiles = 0;
      const RowRun run = next();
      if (run.id < 0) return false;
      group = run.id, begin = run.begin, end = run.end;
      first_row = begin & ~3;
      row_tiles = end > begin ? (end - first_row + kBlockM - 1) / kBlockM : 0;
      tiles = row_tiles * ((p.n_blocks + kPairs - 1) / kPairs);
    }
    return true;
  }

  // Tile t of the walk, after seek(t) or seek_runs(t); n_block counts tiles of kPairs N blocks.
  template <class P>
  FP8GEMM_SM90A_HD GroupTile tile(const P& p, int t) const {
    constexpr int kPanel = 16;
    const int n_tiles = (p.n_blocks + kPairs - 1) / kPairs;
    const int u = t - first_tile, panel = u / (kPanel * n_tiles);
    const int rem = u - panel * kPanel * n_tiles;
    const int rows_in_panel = row_tiles - panel * kPanel < kPanel ? row_tiles - panel * kPanel : kPanel;
    GroupTile g;
    g.group = group;
    g.n_block = rem / rows_in_panel;
    g.m_block = panel * kPanel + rem - g.n_block * rows_in_panel;
    const int nominal = first_row + g.m_block * kBlockM;
    g.lo = nominal > begin ? nominal : begin;
    g.hi = nominal + kBlockM < end ? nominal + kBlockM : end;
    // As the dense tile_at: a tile reaching past the rows loads the last kBlockM real rows (from a 4-row boundary)
    // instead, since TMA fills rows past the end slowly.
    const int last = p.m - kBlockM > 0 ? (p.m - kBlockM + 3) & ~3 : 0;
    g.row0 = nominal < last ? nominal : last;
    return g;
  }
};

}  // namespace fp8gemm_sm90a
