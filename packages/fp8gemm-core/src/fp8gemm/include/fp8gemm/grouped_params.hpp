// The grouped launch arguments as a kernel parameter block, for arch kernels that read A, B and the scales through
// plain pointers (as gemm_params.hpp does for one GEMM). Plain C++ (gfx942 compiles it with a bare clang in HIP mode).
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/ceil_div.hpp"
#include "fp8gemm/gemm_params.hpp"

namespace fp8gemm {

// Contiguous: the A/out/A-scale group strides are 0 (one matrix of m rows). Masked: m is M_max.
struct GroupedParams {
  const uint8_t* a;           // [rows, k] FP8 per group at a + g * a_gs, row stride lda
  const uint8_t* b;           // [n, k] FP8 per group at b + g * b_gs, row stride ldb
  const float* a_scale;       // MN-major per group at a_scale + g * sa_gs: [kb * sa_ld + row]
  const float* b_scale;       // K-major per group at b_scale + g * sb_gs: [(n / 128) * sb_ld + kb]
  void* out;                  // bf16 or fp32 per group at out + g * out_gs elements, row stride ldo
  const int32_t* group_rows;  // contiguous: cumulative row ends; masked: rows per group; row ids: [m] each row's id
  int m, n, k, groups;
  int64_t lda, ldb, ldo, sa_ld, sb_ld;
  int64_t a_gs, b_gs, out_gs, sa_gs, sb_gs;
  int masked, out_fp32;
  int tiles_per_group;  // masked: row tiles per group
  int row_tiles;        // row tiles the grid covers
  int row_ids;          // group_rows holds each row's id (kGroupedRowIds): tiles walk its runs
};

// Rows per group a tile choice can assume: the caller's expected_m, else M_max when masked, else the average.
inline int64_t grouped_rows_hint(bool masked, int64_t m, int64_t groups, int64_t expected_m) {
  return expected_m > 0 ? expected_m : masked ? m : (m + groups - 1) / groups;
}

// Row tiles of block_m rows the grid must cover. Masked: tiles_per_group for each group. Contiguous: the most any
// split of m rows into `groups` groups can need, as each non-empty group adds at most one partial tile.
inline int64_t grouped_row_tiles(bool masked, int64_t m, int64_t groups, int64_t block_m) {
  const int64_t tiles = (m + block_m - 1) / block_m;
  return masked ? groups * tiles : tiles + (groups < m ? groups : m) - 1;
}

// Stretches of rows that each start their own row tiles: the groups (contiguous), or the runs of one id in a row
// (row ids), at most m of them and never counted on the host, which does not read the ids.
inline int64_t grouped_segments(int layout, int64_t m, int64_t groups) {
  return layout == kGroupedRowIds ? m : groups;
}

// The grid of a one-launch grouped GEMM of two tile heights: small_m rows when the groups are decode-sized
// (grouped_rows_hint at most small_m), else large_m; N tiles of block_n columns. Zero tiles: nothing to launch.
struct GroupedGrid {
  bool small;
  int block_m;
  int64_t n_tiles, row_tiles;
  int64_t tiles_per_group;  // masked only
};

// The grid of `layout` (GroupedLayout): row ids as contiguous groups with one group per row at most, so rows sorted
// by id take the tile height and the tiles that the same groups take through cumulative ends.
inline GroupedGrid grouped_layout_grid(int layout, int64_t m, int64_t n, int64_t groups, int64_t expected_m,
                                       int small_m, int large_m, int block_n) {
  if (m < 1 || groups < 1) return {false, large_m, 0, 0, 0};
  const bool masked = layout == kGroupedMasked;
  const bool small = grouped_rows_hint(masked, m, groups, expected_m) <= small_m;
  const int block_m = small ? small_m : large_m;
  return {small, block_m, ceil_div(n, block_n),
          grouped_row_tiles(masked, m, grouped_segments(layout, m, groups), block_m), masked ? ceil_div(m, block_m) : 0};
}

inline GroupedGrid grouped_grid(bool masked, int64_t m, int64_t n, int64_t groups, int64_t expected_m, int small_m,
                                int large_m, int block_n) {
  return grouped_layout_grid(masked ? kGroupedMasked : kGroupedContiguous, m, n, groups, expected_m, small_m, large_m,
                             block_n);
}

// The parameter block of one grouped launch; the host checks sizes only (fp8gemm/grouped_launch.hpp: group_rows is
// the device's to clamp).
inline GroupedParams grouped_params(const GroupedArgs& args, int64_t tiles_per_group, int64_t row_tiles) {
  const bool masked = args.layout == kGroupedMasked;
  GroupedParams p{};
  set_operands(p, args);
  p.group_rows = reinterpret_cast<const int32_t*>(args.group_rows);
  p.groups = static_cast<int>(args.groups);
  p.a_gs = masked ? args.a_group_stride : 0, p.out_gs = masked ? args.out_group_stride : 0;
  p.sa_gs = masked ? args.a_scale_group_stride : 0;
  p.b_gs = args.b_group_stride, p.sb_gs = args.b_scale_group_stride;
  p.masked = masked;
  p.row_ids = args.layout == kGroupedRowIds;
  p.tiles_per_group = static_cast<int>(tiles_per_group);
  p.row_tiles = static_cast<int>(row_tiles);
  return p;
}

}  // namespace fp8gemm
