// Shape heuristics for the sm_120 kernel: which tile config, how many K splits. Kept apart from
// the kernel so the policy reads in one place (and workspace_bytes() uses the same decision).
#pragma once
#include <algorithm>
#include <cstdint>

#include "fp8gemm/ceil_div.hpp"
#include "fp8gemm/grouped_params.hpp"
#include "fp8gemm/split_k.hpp"

namespace fp8gemm_sm120 {

using fp8gemm::ceil_div;

constexpr int kBlockN = 128;  // = scale block: one b_scale per tile column and K block
constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage

enum class TileConfig { M64, M128 };

struct Plan {
  TileConfig config;
  int block_m;
  fp8gemm::SplitK split;  // splits > 1: fp32 partials in the workspace, then a reduction kernel writes out
};

// Small M (decode) uses 64-row tiles; N/128 tiles alone cannot fill the GPU there, so K is split
// until about one wave of blocks is resident (rounded up), keeping >= 4 K blocks (512 of K) per split.
constexpr fp8gemm::SplitKPolicy kSplitK{4, true};

inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count) {
  const bool small_m = m <= 64;
  const int block_m = small_m ? 64 : 128;
  const int64_t tiles = ceil_div(m, block_m) * ceil_div(n, kBlockN);
  return {small_m ? TileConfig::M64 : TileConfig::M128, block_m,
          fp8gemm::split_k(tiles, static_cast<int>(k / kBlockK), sm_count, kSplitK)};
}

inline int64_t workspace_bytes(int64_t m, int64_t n, int64_t k, int sm_count) {
  return fp8gemm::split_workspace_bytes(plan_for(m, n, k, sm_count).split.splits, m, n);
}

// The weight-gradient GEMM (wgrad.cu): the dense tiles (64 rows for M <= 64), never split along K (an accumulated out
// would need the splits' partials reduced into it; its hidden-by-hidden shapes fill the SMs without). Grid: N tiles x
// M tiles (x experts for the k-grouped form).
struct WgradPlan {
  TileConfig config;
  int block_m;
  int64_t grid_x, grid_y;
};

inline WgradPlan wgrad_plan_for(int64_t m, int64_t n) {
  const bool small_m = m <= 64;
  const int block_m = small_m ? 64 : 128;
  return {small_m ? TileConfig::M64 : TileConfig::M128, block_m, ceil_div(n, kBlockN), ceil_div(m, block_m)};
}

// Grouped GEMMs (grouped.cu), one launch, no split-K: the dense kernel's 64-row tiles when the groups are
// decode-sized (rows per group: the caller's expected_m, else M_max when masked, else the average), else 128.
// Row tiles: masked, tiles_per_group per group; contiguous, the most any split of m rows into `groups` groups can
// need (each non-empty group adds at most one partial tile to ceil(m / block_m)); row ids, as many with a group a
// row at most (fp8gemm::grouped_layout_grid). grid_y is capped at the CUDA limit; blocks then stride over the row
// tiles. Row ids: at two blocks per SM (`sms`), as each block reads the ids once for all its tiles.
constexpr int64_t kMaxGridY = 65535;

struct GroupedPlan {
  TileConfig config;
  int block_m;
  int64_t grid_x, grid_y, row_tiles;
  int64_t tiles_per_group;  // masked only
};

inline GroupedPlan grouped_plan_for(int layout, int64_t m, int64_t n, int64_t groups, int64_t expected_m,
                                    int64_t sms = 0) {
  const fp8gemm::GroupedGrid g = fp8gemm::grouped_layout_grid(layout, m, n, groups, expected_m, 64, 128, kBlockN);
  int64_t grid_y = g.row_tiles < kMaxGridY ? g.row_tiles : kMaxGridY;
  if (layout == fp8gemm::kGroupedRowIds && g.n_tiles > 0) {
    const int64_t waves = (2 * std::max<int64_t>(sms, 1) + g.n_tiles - 1) / g.n_tiles;
    grid_y = std::min(grid_y, waves);
  }
  return {g.small ? TileConfig::M64 : TileConfig::M128, g.block_m, g.n_tiles, grid_y, g.row_tiles, g.tiles_per_group};
}

}  // namespace fp8gemm_sm120
