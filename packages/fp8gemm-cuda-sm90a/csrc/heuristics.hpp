// Shape heuristics for the sm_90a kernel, in one place: tile shape, K splits, grid size.
// workspace_bytes() and launch() both read plan_for(), so they always agree.
#pragma once
#include <algorithm>
#include <cstdint>

namespace fp8gemm_sm90a {

constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage
constexpr int kGroupM = 16;   // tile rasterisation: M blocks per group (FP8GEMM_SM90A_GROUP_M overrides)

// Forced choices for experiments (FP8GEMM_SM90A_TILE="consumers,block_n[,cluster]",
// FP8GEMM_SM90A_SPLITS=n); 0 leaves the choice to the policy.
struct Tuning {
  int consumers = 0, block_n = 0, cluster = 0, splits = 0;
};

struct Plan {
  int consumers;  // consumer warpgroups: BLOCK_M = 64 * consumers
  int block_n;    // tile width: 16, 32, 64, 128, 160 or 192
  int cluster;    // CTAs per cluster along M, sharing (multicasting) the B tile
  int m_blocks, n_blocks, splits, kb_per_split;
  int grid;  // persistent CTAs
  int64_t workspace_bytes;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tile shapes launch.cu instantiates.
inline bool tile_supported(int consumers, int block_n, int cluster) {
  if (cluster == 2) return consumers == 2 && block_n >= 128;
  if (cluster != 1) return false;
  switch (consumers) {
    case 1: return block_n == 16 || block_n == 32 || block_n == 64 || block_n == 128;
    case 2: return block_n == 64 || block_n == 128 || block_n == 160 || block_n == 192;
    case 3: return block_n == 128;
    default: return false;
  }
}

// The policy, each choice measured on an H200 (bench/NOTES.md, 2026-11-22):
// - Tile height (consumer warpgroups): 64 rows for M <= 64 (decode); 192 rows (3 consumers) from
//   M = 2048; 128 rows between, where 192 would mostly compute padding.
// - Split-K: when the tiles cannot fill the SMs, K is split (fp32 partials + a reduction) until
//   about one wave of CTAs runs, keeping >= 2 K blocks per split.
// - Clusters: 2-CTA multicast measured no faster than 1, so 1 is the default.
// - The grid is persistent: at most one CTA per SM.
inline void choose_tile(int64_t m, int64_t n, Plan& p) {
  (void)n;
  p.consumers = m <= 64 ? 1 : (m >= 2048 ? 3 : 2);
  p.block_n = 128;
  p.cluster = 1;
}

inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count, const Tuning& tuning = {}) {
  Plan p{};
  choose_tile(m, n, p);
  if (tuning.consumers) p.consumers = tuning.consumers;
  if (tuning.block_n) p.block_n = tuning.block_n;
  if (tuning.cluster) p.cluster = tuning.cluster;
  p.m_blocks = static_cast<int>(ceil_div(m, 64 * p.consumers));
  p.n_blocks = static_cast<int>(ceil_div(n, p.block_n));
  if (p.m_blocks < 2) p.cluster = 1;  // nothing to pair
  const int kb_total = static_cast<int>(k / kBlockK);
  const int64_t tiles = int64_t(p.m_blocks) * p.n_blocks;
  int splits = 1;
  if (tiles < sm_count) splits = static_cast<int>(std::clamp<int64_t>(sm_count / tiles, 1, std::max(1, kb_total / 2)));
  if (tuning.splits) splits = std::clamp(tuning.splits, 1, kb_total);
  p.kb_per_split = static_cast<int>(ceil_div(kb_total, splits));
  p.splits = static_cast<int>(ceil_div(kb_total, p.kb_per_split));  // no empty split
  // The grid counts whole clusters.
  const int64_t cluster_tiles = ceil_div(p.m_blocks, p.cluster) * p.n_blocks * p.splits;
  p.grid = static_cast<int>(std::min<int64_t>(cluster_tiles, sm_count / p.cluster) * p.cluster);
  p.workspace_bytes = p.splits > 1 ? int64_t(p.splits) * m * n * int64_t(sizeof(float)) : 0;
  return p;
}

}  // namespace fp8gemm_sm90a
