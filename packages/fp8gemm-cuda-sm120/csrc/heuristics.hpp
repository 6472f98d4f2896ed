// Shape heuristics for the sm_120 kernel: which tile config, how many K splits. Kept apart from
// the kernel so the policy reads in one place (and workspace_bytes() uses the same decision).
#pragma once
#include <algorithm>
#include <cstdint>

namespace fp8gemm_sm120 {

constexpr int kBlockN = 128;  // = scale block: one b_scale per tile column and K block
constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage

enum class TileConfig { M64, M128 };

struct Plan {
  TileConfig config;
  int block_m;
  int split_k;  // >1: fp32 partials in the workspace, then a reduction kernel writes out
};

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Small M (decode) uses 64-row tiles; N/128 tiles alone cannot fill the GPU there, so K is split
// until about one wave of blocks is resident, keeping >= 4 K blocks (512 of K) per split.
inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count) {
  const bool small_m = m <= 64;
  Plan plan{small_m ? TileConfig::M64 : TileConfig::M128, small_m ? 64 : 128, 1};
  const int tiles = ceil_div(m, plan.block_m) * ceil_div(n, kBlockN);
  const int k_blocks = static_cast<int>(k / kBlockK);
  if (tiles < sm_count) {
    const int want = ceil_div(sm_count, tiles);
    plan.split_k = std::max(1, std::min(want, k_blocks / 4));
  }
  return plan;
}

inline int64_t workspace_bytes(int64_t m, int64_t n, int64_t k, int sm_count) {
  const Plan plan = plan_for(m, n, k, sm_count);
  return plan.split_k > 1 ? int64_t(plan.split_k) * m * n * int64_t(sizeof(float)) : 0;
}

}  // namespace fp8gemm_sm120
