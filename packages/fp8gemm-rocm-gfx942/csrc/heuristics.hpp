// Shape policy and launch geometry for the gfx942 kernel, in one place. Host-only C++, so the unit
// tests call the same code (through _C.plan) that launch() uses.
#pragma once
#include <cstdint>

#include "fp8gemm/ceil_div.hpp"
#include "fp8gemm/grouped_params.hpp"
#include "fp8gemm/split_k.hpp"

namespace fp8gemm_gfx942 {

using fp8gemm::ceil_div;

constexpr int kBlockN = 128;  // = scale block: one b_scale per tile and K block
constexpr int kBlockK = 128;  // = scale block: one promotion per 128 of K
constexpr int kThreads = 256;  // 4 wavefronts of 64

enum class TileConfig { M32, M128 };

struct Geometry {
  TileConfig config;
  int block_m;
  int grid_x, grid_y, grid_z;  // N tiles, M tiles, K splits
  int kb_per_split;
  int64_t workspace_bytes;  // split-K fp32 partials; 0 without split
};

// Decode-sized M (<= 32) gets 32-row tiles; when the tiles cannot fill the CUs (MI300X: 304), K is
// split until about one wave of workgroups runs (rounded up), with >= 4 K blocks (512 of K) per split.
constexpr fp8gemm::SplitKPolicy kSplitK{4, true};

inline Geometry geometry(int64_t m, int64_t n, int64_t k, int cu_count) {
  Geometry g{};
  g.config = m <= 32 ? TileConfig::M32 : TileConfig::M128;
  g.block_m = m <= 32 ? 32 : 128;
  g.grid_x = static_cast<int>(ceil_div(n, kBlockN));
  g.grid_y = static_cast<int>(ceil_div(m, g.block_m));
  const fp8gemm::SplitK split = fp8gemm::split_k(int64_t(g.grid_x) * g.grid_y, static_cast<int>(k / kBlockK), cu_count, kSplitK);
  g.kb_per_split = split.kb_per_split;
  g.grid_z = split.splits;
  g.workspace_bytes = fp8gemm::split_workspace_bytes(split.splits, m, n);
  return g;
}

// The weight-gradient GEMM: the tiles of geometry(), never split along K (an accumulating GEMM would need its partial
// sums reduced into out; its hidden-size by hidden-size shapes fill the CUs without it).
inline Geometry wgrad_geometry(int64_t m, int64_t n, int64_t k) {
  Geometry g{};
  g.config = m <= 32 ? TileConfig::M32 : TileConfig::M128;
  g.block_m = m <= 32 ? 32 : 128;
  g.grid_x = static_cast<int>(ceil_div(n, kBlockN));
  g.grid_y = static_cast<int>(ceil_div(m, g.block_m));
  g.grid_z = 1;
  g.kb_per_split = static_cast<int>(k / kBlockK);
  return g;
}

// Grouped GEMMs (grouped.hip), one launch, no split-K: 32-row tiles when the groups are decode-sized
// (fp8gemm::grouped_rows_hint), else 128; the grid is N tiles x the row tiles of fp8gemm::grouped_layout_grid.
struct GroupedGeometry {
  TileConfig config;
  int block_m;
  int64_t grid_x, grid_y;
  int64_t tiles_per_group;  // masked only
};

inline GroupedGeometry grouped_geometry(int layout, int64_t m, int64_t n, int64_t groups, int64_t expected_m) {
  const fp8gemm::GroupedGrid g = fp8gemm::grouped_layout_grid(layout, m, n, groups, expected_m, 32, 128, kBlockN);
  return {g.small ? TileConfig::M32 : TileConfig::M128, g.block_m, g.n_tiles, g.row_tiles, g.tiles_per_group};
}

}  // namespace fp8gemm_gfx942
