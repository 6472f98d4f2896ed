// Grouped FP8 block-scaled GEMMs (mixture of experts), all groups in one launch:
//
// out_g[r, n] = sum_kb a_scale_g[r, kb] * b_scale_g[n / 128, kb] * sum_{k in kb} a_g[r, k] * b_g[n, k]
//
// The grid is N tiles x row tiles of every group. Each block maps its row tile to (group, first row, group's row
// end) on the device from group_rows, clamped here (the host never sees them), then runs the dense kernel's
// tile_mainloop and tile_store on that group's A, B, scales and out. A tile's rows end at its group's end: A rows
// past it are zero-filled and never stored, so no tile writes another group's rows or outside out. Row ids: the
// groups are the runs of one id, which each block finds in one pass over the ids (row_ids_tile.cuh).
#pragma once

#include "contiguous_tile.cuh"
#include "fp8gemm/grouped_params.hpp"
#include "gemm_kernel.cuh"
#include "row_ids_tile.cuh"

namespace fp8gemm_sm120 {

using GroupedParams = fp8gemm::GroupedParams;

__device__ __forceinline__ int clamp_rows(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

// Contiguous: contiguous_tile.cuh (each warp scans the group ends with shuffles).

// Masked: tiles_per_group row tiles per group; those at or past the group's rows (clamped to [0, M_max]) are idle.
template <int BM>
__device__ __forceinline__ GroupTile masked_tile(const GroupedParams& p, int y) {
  const int g = y / p.tiles_per_group, row0 = (y % p.tiles_per_group) * BM;
  const int rows = clamp_rows(__ldg(p.group_rows + g), 0, p.m);
  return row0 < rows ? GroupTile{g, row0, rows} : GroupTile{-1, 0, 0};
}

template <int WARPS_M, int STAGES>
__global__ void __launch_bounds__(Traits<WARPS_M, STAGES>::kThreads, 1) grouped_kernel(const GroupedParams p) {
  using T = Traits<WARPS_M, STAGES>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int n0 = blockIdx.x * kBlockN;
  RowIdsCursor cursor;  // row ids: the block's place in the ids, its scans' scratch in the stages' memory
  for (int tile = blockIdx.y; tile < p.row_tiles; tile += gridDim.y) {
    int* scratch = reinterpret_cast<int*>(smem);
    const GroupTile gt = p.row_ids  ? row_ids_tile<T::kBlockM, T::kThreads>(p, tile, cursor, scratch)
                         : p.masked ? masked_tile<T::kBlockM>(p, tile)
                                    : contiguous_tile<T::kBlockM>(p, tile);
    if (gt.group < 0 && p.row_ids) break;  // no later tile either
    if (gt.group < 0) continue;  // the same for the whole block, so no barrier is skipped by some threads only
    const int64_t g = gt.group;
    const TileIn t{p.a + g * p.a_gs, p.b + g * p.b_gs, p.a_scale + g * p.sa_gs, p.lda, p.ldb, p.sa_ld, gt.row_end, p.n};  // rows valid below the group end
    const float* b_scale_row = p.b_scale + g * p.sb_gs + (n0 / kBlockN) * p.sb_ld;

    TileAcc<WARPS_M, STAGES> total;
    tile_mainloop<WARPS_M, STAGES, false>(t, b_scale_row, smem, gt.row0, n0, 0, p.k / kBlockK, total);
    void* out = static_cast<uint8_t*>(p.out) + g * p.out_gs * (p.out_fp32 ? 4 : 2);
    tile_store<WARPS_M, STAGES>(total, gt.row0, gt.row_end, n0, p.n, [&](int row, int col, float x, float y) {
      store_pair(out, p.ldo, p.out_fp32, row, col, x, y);
    });
    __syncthreads();  // the next tile's prologue overwrites stages this one's last iterations read
  }
}

}  // namespace fp8gemm_sm120
