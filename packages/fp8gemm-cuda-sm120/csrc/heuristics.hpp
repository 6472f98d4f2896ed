// Shape heuristics for the sm_120 kernel: which tile config, how many K splits. Kept apart from
// the kernel so the policy reads in one place (and workspace_bytes() uses the same decision).
#pragma once
#include <cstdint>

#include "fp8gemm/ceil_div.hpp"
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

}  // namespace fp8gemm_sm120
