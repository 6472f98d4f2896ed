// The contiguous grouped layout (`offs`, cumulative row ends): the group holding a block's row tile, found from the
// group ends by each warp on its own (shuffles only, no shared memory or barrier), so every warp of a block finds the
// same tile. A walk reading one end at a time paid one dependent load per group (128-256 experts) before a first tile.
#pragma once

#include "fp8gemm/grouped_params.hpp"
#include "row_ids_tile.cuh"

namespace fp8gemm_sm120 {

// Row tile y in the order of the groups, each group's end clamped to [previous end, m] (the running maximum of the
// ends clamped to [0, m]) so the groups never overlap or leave A; empty groups add no tiles; {-1, 0, 0} past the last
// tile. A step reads 32 x kPer ends (lane l: kPer consecutive groups, their loads in flight together), scans the ends
// and then the tiles over the lanes, and ends at the step holding tile y: the tile a walk of the groups in order finds.
// Every lane of the warp calls it (full-mask shuffles).
template <int BM>
__device__ __forceinline__ GroupTile contiguous_tile(const fp8gemm::GroupedParams& p, int y) {
  constexpr int kPer = 8;  // 256 groups a step: one step for up to 256 experts
  const int lane = threadIdx.x % 32, m = p.m;
  int carry = 0, before = 0;  // the groups before the step: their last clamped end, their tiles
#pragma unroll 1
  for (int g0 = 0; g0 < p.groups; g0 += 32 * kPer) {
    const int first = g0 + lane * kPer;
    auto raw_end = [&](int j) { return first + j < p.groups ? __ldg(p.group_rows + first + j) : 0; };  // 0: no rows
    int end[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) end[j] = raw_end(j);
    int high = carry;  // the largest end up to this lane's last group, not yet clamped to m
#pragma unroll
    for (int j = 0; j < kPer; ++j) high = max(high, end[j]);
#pragma unroll
    for (int d = 1; d < 32; d *= 2) high = max(high, __shfl_up_sync(~0u, high, d));  // lanes below d read their own
    const int up = __shfl_up_sync(~0u, high, 1);
    const int lane_begin = min(lane ? up : carry, m);
    int begin = lane_begin, tiles = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int end_j = min(max(end[j], begin), m);
      tiles += (end_j - begin + BM - 1) / BM;
      begin = end_j;
    }
    int through = tiles;  // tiles of the step's groups up to this lane's last
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int below = __shfl_up_sync(~0u, through, d);
      if (lane >= d) through += below;
    }
    const int total = __shfl_sync(~0u, through, 31);
    if (y < before + total) {  // warp-uniform: tile y is in this step, in the first lane whose tiles pass y
      const int src = __ffs(__ballot_sync(~0u, y < before + through)) - 1;
      GroupTile t{-1, 0, 0};
      int first_tile = before + through - tiles;
      begin = lane_begin;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {  // again from memory (L1): the ends need no registers across the scans
        const int end_j = min(max(raw_end(j), begin), m);
        const int n = (end_j - begin + BM - 1) / BM;
        if (t.group < 0 && y < first_tile + n) t = {first + j, begin + (y - first_tile) * BM, end_j};
        first_tile += n;
        begin = end_j;
      }
      return {__shfl_sync(~0u, t.group, src), __shfl_sync(~0u, t.row0, src), __shfl_sync(~0u, t.row_end, src)};
    }
    before += total;
    carry = min(__shfl_sync(~0u, high, 31), m);
  }
  return {-1, 0, 0};
}

}  // namespace fp8gemm_sm120
