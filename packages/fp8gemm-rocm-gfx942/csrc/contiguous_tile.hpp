// The contiguous grouped layout (`offs`, cumulative row ends) on gfx942: the group holding a workgroup's row tile,
// found from the group ends by each wavefront on its own (cross-lane reads only, no LDS or barrier), so every
// wavefront of a workgroup finds the same tile. A walk reading one end at a time paid one dependent load per group
// (128-256 experts) before a first tile.
#pragma once
#include "fp8gemm/grouped_params.hpp"
#include "hip_compat.hpp"

namespace fp8gemm_gfx942 {

// A workgroup's tile: its group (-1: none), its first row and the group's row end, in the group's view of A/out.
struct GroupTile {
  int group, row0, row_end;
};

// v of the lane d below (a lane below d reads its own), through ds_bpermute.
__device__ inline int lane_below(int v, int lane, int d) {
  return __builtin_amdgcn_ds_bpermute((lane >= d ? lane - d : lane) << 2, v);
}

// v of lane src, src the same in every lane, as a value the compiler knows is uniform: the GPU's scalar read keeps
// the tile, and the main loop's addressing from it, in scalar registers (the CPU emulator has no readlane).
__device__ inline int lane_value(int v, int src) {
#if defined(__AMDGCN__)
  return __builtin_amdgcn_readlane(v, src);
#else
  return __builtin_amdgcn_ds_bpermute(src << 2, v);
#endif
}

// Row tile y in the order of the groups, each group's end clamped to [previous end, m] (the running maximum of the
// ends clamped to [0, m]) so the groups never overlap or leave A; empty groups add no tiles; {-1, 0, 0} past the last
// tile. A step reads 64 x kPer ends (lane l: kPer consecutive groups, their loads in flight together), scans the ends
// and then the tiles over the lanes, and ends at the step holding tile y: the tile a walk of the groups in order finds.
// Every lane of the wavefront calls it (ds_bpermute reads only active lanes).
template <int BM>
__device__ inline GroupTile contiguous_tile(const fp8gemm::GroupedParams& p, int y) {
  constexpr int kLanes = 64, kPer = 4;  // 256 groups a step: one step for up to 256 experts
  const int lane = static_cast<int>(__builtin_amdgcn_workitem_id_x()) % kLanes, m = p.m;
  auto max_int = [](int a, int b) { return a < b ? b : a; };
  auto min_int = [](int a, int b) { return a < b ? a : b; };
  int carry = 0, before = 0;  // the groups before the step: their last clamped end, their tiles
  for (int g0 = 0; g0 < p.groups; g0 += kLanes * kPer) {
    const int first = g0 + lane * kPer;
    int end[kPer];
    for (int j = 0; j < kPer; ++j) end[j] = first + j < p.groups ? p.group_rows[first + j] : 0;  // 0: no rows
    int high = carry;  // the largest end up to this lane's last group, not yet clamped to m
    for (int j = 0; j < kPer; ++j) high = max_int(high, end[j]);
    for (int d = 1; d < kLanes; d *= 2) high = max_int(high, lane_below(high, lane, d));
    const int up = lane_below(high, lane, 1);
    const int lane_begin = min_int(lane ? up : carry, m);
    int begin = lane_begin, tiles = 0;
    for (int j = 0; j < kPer; ++j) {
      end[j] = min_int(max_int(end[j], begin), m);
      tiles += (end[j] - begin + BM - 1) / BM;
      begin = end[j];
    }
    int through = tiles;  // tiles of the step's groups up to this lane's last
    for (int d = 1; d < kLanes; d *= 2) {
      const int below = lane_below(through, lane, d);
      through += lane >= d ? below : 0;
    }
    const int total = lane_value(through, kLanes - 1);
    if (y < before + total) {  // uniform: tile y is in this step
      // The first lane whose tiles pass y: a binary search over the lanes' counts, which never decrease.
      int src = 0;
      for (int step = kLanes / 2; step > 0; step /= 2)
        src += lane_value(through, src + step - 1) <= y - before ? step : 0;
      GroupTile t{-1, 0, 0};
      int first_tile = before + through - tiles;
      begin = lane_begin;
      for (int j = 0; j < kPer; ++j) {
        const int n = (end[j] - begin + BM - 1) / BM;
        if (t.group < 0 && y < first_tile + n) t = {first + j, begin + (y - first_tile) * BM, end[j]};
        first_tile += n;
        begin = end[j];
      }
      return {lane_value(t.group, src), lane_value(t.row0, src), lane_value(t.row_end, src)};
    }
    before += total;
    carry = min_int(lane_value(high, kLanes - 1), m);
  }
  return {-1, 0, 0};
}

}  // namespace fp8gemm_gfx942
