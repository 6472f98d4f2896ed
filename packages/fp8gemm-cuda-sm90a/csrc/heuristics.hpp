// Shape heuristics for the sm_90a kernel, in one place: tile height, K splits, grid size.
// workspace_bytes() and launch() both read plan_for(), so they always agree.
#pragma once
#include <algorithm>
#include <cstdint>

namespace fp8gemm_sm90a {

constexpr int kBlockN = 128;  // = scale block: one b_scale per tile and K block
constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage
constexpr int kGroupM = 16;   // tile rasterisation: M blocks per group (FP8GEMM_SM90A_GROUP_M overrides)

struct Plan {
  int consumers;  // consumer warpgroups: BLOCK_M = 64 * consumers
  int cluster;    // CTAs per cluster along M, sharing (multicasting) the B tile
  int m_blocks, n_blocks, splits, kb_per_split;
  int grid;  // persistent CTAs
  int64_t workspace_bytes;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The policy, each choice measured on an H200 (bench/results, 2026-11-22):
// - Tile height (consumer warpgroups): 64 rows for M <= 64 (decode); 192 rows (3 consumers) from
//   M = 2048, 0-13% faster than 128 there; 128 rows between, where 192 would mostly compute padding.
//   `consumers` (2 or 3, FP8GEMM_SM90A_CONSUMERS) overrides for experiments.
// - Split-K: when the tiles cannot fill the SMs, K is split (fp32 partials + a reduction) until
//   about one wave of CTAs runs, keeping >= 2 K blocks per split.
// - Clusters: `cluster` = 2 pairs 128-row tiles along M and multicasts the shared B tile; it measured
//   no faster than 1, so 1 is the default (FP8GEMM_SM90A_CLUSTER=2 for experiments).
// - The grid is persistent: at most one CTA per SM.
inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count, int cluster = 1, int consumers = 0) {
  Plan p{};
  p.consumers = m <= 64 ? 1 : consumers ? consumers : (m >= 2048 ? 3 : 2);
  p.m_blocks = static_cast<int>(ceil_div(m, 64 * p.consumers));
  p.n_blocks = static_cast<int>(ceil_div(n, kBlockN));
  const int kb_total = static_cast<int>(k / kBlockK);
  const int64_t tiles = int64_t(p.m_blocks) * p.n_blocks;
  int splits = 1;
  if (tiles < sm_count) splits = static_cast<int>(std::clamp<int64_t>(sm_count / tiles, 1, std::max(1, kb_total / 2)));
  p.kb_per_split = static_cast<int>(ceil_div(kb_total, splits));
  p.splits = static_cast<int>(ceil_div(kb_total, p.kb_per_split));  // no empty split
  // Two CTAs share each B tile (TMA multicast) when there are M blocks to pair; the grid then
  // counts whole clusters.
  p.cluster = p.consumers == 2 && p.m_blocks > 1 ? cluster : 1;
  const int64_t cluster_tiles = ceil_div(p.m_blocks, p.cluster) * p.n_blocks * p.splits;
  p.grid = static_cast<int>(std::min<int64_t>(cluster_tiles, sm_count / p.cluster) * p.cluster);
  p.workspace_bytes = p.splits > 1 ? int64_t(p.splits) * m * n * int64_t(sizeof(float)) : 0;
  return p;
}

}  // namespace fp8gemm_sm90a
