// Shape heuristics for the sm_90a kernels, in one place: tile, K splits, grid, rasterisation, main loop.
// workspace_bytes() and launch() both read plan_for(), so they always agree. Plain C++ (tests build it
// with the host compiler). The measurements behind each rule: docs/kernels/sm90a.md.
#pragma once
#include <algorithm>
#include <cstdint>

#include "fp8gemm/ceil_div.hpp"
#include "fp8gemm/grouped_params.hpp"
#include "fp8gemm/split_k.hpp"
#include "tile_config.hpp"

namespace fp8gemm_sm90a {

using fp8gemm::ceil_div;

// Tile rasterisation: M blocks per group (see plan_for).
constexpr int kGroupM = 16;
constexpr int kGroupMOneWave = 2;
constexpr int kGroupMNarrowWave = 4;
// 64 x 16 and 64 x 32 tiles with at least this many K blocks per split share them out over two warpgroups.
constexpr int kWarpgroupSplitMinKb = 48;

struct Plan {
  TileConfig tile;  // the kernel: rows, cols, cluster and main loop (one of tile_config.hpp kTiles)
  int m_blocks, n_blocks, splits, kb_per_split;
  int grid;              // persistent CTAs
  int group_m;           // rasterisation: cluster tiles are walked in groups of group_m M blocks, M fastest
  bool placement_pairs;  // 1-CTA tiles launched as 2-CTA clusters, for placement only
  int64_t workspace_bytes;
};

// Split-K (the core's shared policy): when the tiles cannot fill the SMs, K is split (fp32 partials + a
// reduction launch) until at most one wave of CTAs runs, keeping >= 2 K blocks per split.
constexpr fp8gemm::SplitKPolicy kSplitK{2, false};

// Candidate tiles with the rate each sustained on an H200 (TFLOP/s), fitted to timings of every tile
// on the benchmark shapes: wider tiles reuse each loaded byte more, so they run faster per tile but
// leave more of the last wave idle or force more K splits on small problems. Only the ranking matters:
// the fixed cost is the same for every candidate.
struct TileRate {
  int rows, cols, cluster;
  double tflops;
  double split_tflops = 0;  // the rate in K splits, where it differs
};
constexpr TileRate kTileRates[] = {
    {64, 16, 1, 300}, {64, 32, 1, 450}, {64, 64, 1, 615}, {64, 96, 1, 620}, {64, 128, 1, 690},
    {128, 64, 1, 840}, {128, 96, 1, 880}, {128, 128, 1, 1120}, {128, 160, 1, 1100}, {128, 192, 1, 1150},
    {192, 128, 1, 1220, 1050},  // in K splits it keeps a lower rate: rated 1220 there it lost 11-14%
    {256, 128, 1, 1230},
    {256, 128, 2, 1270},  // A multicast along N; B multicast (the other clusters) measured no faster
};

// Work items of a tile choice: a cluster's tiles are whole pairs, so an odd block count along the
// paired dimension computes one padding block.
inline int64_t tiles_of(int64_t m, int64_t n, int rows, int cols, int cluster) {
  int64_t m_blocks = ceil_div(m, rows), n_blocks = ceil_div(n, cols);
  int64_t& paired = pairs_along_n(rows) ? n_blocks : m_blocks;
  if (cluster > 1 && paired >= cluster) paired = ceil_div(paired, cluster) * cluster;
  return m_blocks * n_blocks;
}

// Decode batches of up to 128 rows stream B at DRAM speed, so K splits buy nothing and their reduction
// decides: a split candidate is not modelled faster than streaming A, B and the output once (3.0 TB/s).
// Unsplit candidates are not floored (that measured slower). Tiles taller than M load only its rows
// (launch_tiles.cuh), so their padding costs nothing beyond the compute.
constexpr double kDramBytesPerUs = 3.0e6;

// Modelled run time (us) of one tile choice: whole waves of (tile x K split) work items at the
// tile's rate, a fixed launch/fill cost, and for split-K the reduction launch and its fp32 partials.
inline double modelled_us(int64_t m, int64_t n, int64_t k, const TileRate& t, int sm_count) {
  const int64_t tiles = tiles_of(m, n, t.rows, t.cols, t.cluster);
  const fp8gemm::SplitK split = fp8gemm::split_k(tiles, static_cast<int>(k / kBlockK), sm_count, kSplitK);
  const int kb_per_split = split.kb_per_split;
  const int64_t splits = split.splits;
  const double waves = static_cast<double>(ceil_div(tiles * splits, sm_count));
  const double flops_per_item = 2.0 * t.rows * t.cols * kBlockK * kb_per_split;
  const double tflops = splits > 1 && t.split_tflops > 0 ? t.split_tflops : t.tflops;
  double compute_us = waves * flops_per_item / (tflops * 1e6 / sm_count);
  if (m <= 128 && splits > 1) compute_us = std::max(compute_us, double(m * k + n * k + m * n * 2) / kDramBytesPerUs);
  double us = 2.0 + compute_us;
  if (splits > 1) us += 2.3 + double(splits) * m * n * 4 / 2.1e6;  // partials read at ~2.1 TB/s
  return us;
}

// The policy: the candidate with the smallest modelled time; 64-row tiles only for M <= 64 (decode),
// where the taller ones would compute padding.
inline void choose_tile(int64_t m, int64_t n, int64_t k, int sm_count, TileConfig& tile) {
  double best = 0;
  for (const TileRate& t : kTileRates) {
    if (m <= 64 && t.rows > 64) continue;
    const double us = modelled_us(m, n, k, t, sm_count);
    if (best == 0 || us < best) best = us, tile.rows = t.rows, tile.cols = t.cols, tile.cluster = t.cluster;
  }
}

// Rows of A plus rows of B that one wave of `wave` tiles touches when tiles are walked in groups of
// `group` M blocks, M fastest (the L2 working set DeepGEMM's scheduler also minimises).
inline int64_t wave_footprint(int64_t wave, int group, int64_t m_blocks, int64_t n_blocks, int block_m, int block_n) {
  const int64_t rows = std::min<int64_t>(group, m_blocks);
  const int64_t n_span = std::min(n_blocks, ceil_div(wave, rows));
  const int64_t m_span = std::min(m_blocks, rows * ceil_div(wave, rows * n_blocks));
  return m_span * block_m + n_span * block_n;
}

// The main loop of a chosen shape: the one-set loop where two accumulator sets do not fit, and on long K
// for 128 x 128 tiles (measured 1.03-1.04x from 32 K blocks per tile, slower below 24); the warpgroup K
// split for 64 x 16 and 64 x 32 tiles on long K (their consumer, not the loads, bounds a K block).
inline MainLoop main_loop_for(const TileConfig& t, int kb_per_split) {
  if (t.cols > kBlockK || t.rows > 128) return MainLoop::kOneSet;
  if (t.rows == 128 && t.cols == 128 && t.cluster == 1 && kb_per_split >= kUnrolledMinKb) return MainLoop::kOneSet;
  if (t.rows == 64 && (t.cols == 16 || t.cols == 32) && t.cluster == 1 && kb_per_split >= kWarpgroupSplitMinKb)
    return MainLoop::kSplitWarpgroups;
  return MainLoop::kTwoSets;
}

inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count) {
  Plan p{};
  TileConfig& t = p.tile;
  choose_tile(m, n, k, sm_count, t);
  p.m_blocks = static_cast<int>(ceil_div(m, t.rows));
  p.n_blocks = static_cast<int>(ceil_div(n, t.cols));
  const bool along_n = pairs_along_n(t.rows);
  if ((along_n ? p.n_blocks : p.m_blocks) < 2) t.cluster = 1;  // nothing to pair
  const fp8gemm::SplitK split =
      fp8gemm::split_k(int64_t(p.m_blocks) * p.n_blocks, static_cast<int>(k / kBlockK), sm_count, kSplitK);
  p.kb_per_split = split.kb_per_split, p.splits = split.splits;  // no empty split
  // The grid counts whole clusters.
  const int64_t cluster_tiles = (along_n ? p.m_blocks * ceil_div(p.n_blocks, t.cluster)
                                         : ceil_div(p.m_blocks, t.cluster) * p.n_blocks) * p.splits;
  p.grid = static_cast<int>(std::min<int64_t>(cluster_tiles, sm_count / t.cluster) * t.cluster);
  // Groups of 16 M blocks keep a wave's A and B blocks few (L2 reuse across waves). When every CTA takes
  // exactly one tile of at most 96 columns, from 4 M blocks up, M blocks walked in pairs measured faster
  // (the order then only places tiles on SMs). Several waves of unclustered, unsplit tiles: groups of 4
  // where a wave of them touches fewer rows of A and B than with groups of 16. The 256 x 128 multicast
  // tiles keep 16 (groups of 8, which the footprint prefers there, measured slower).
  const bool one_wave = p.splits == 1 && cluster_tiles <= sm_count / t.cluster;
  p.group_m = one_wave && p.m_blocks >= 4 && t.cols <= 96 ? kGroupMOneWave : kGroupM;
  auto footprint = [&](int group) { return wave_footprint(p.grid, group, p.m_blocks, p.n_blocks, t.rows, t.cols); };
  if (!one_wave && p.splits == 1 && t.cluster == 1 && footprint(kGroupMNarrowWave) < footprint(kGroupM))
    p.group_m = kGroupMNarrowWave;
  // Placement pairs: 1-CTA tiles launched in 2-CTA clusters, with no multicast and no cross-CTA barrier.
  // A cluster's two CTAs run on the two SMs of one TPC, and consecutive tiles are adjacent M blocks of
  // one N block, so their reads of the same B block merge on the way to the L2. Level with one M block
  // (nothing shared but the small A block), so those stay unpaired. An odd grid gains a CTA that finds no
  // tile, unless that would exceed the SMs.
  p.placement_pairs = t.cluster == 1 && p.m_blocks >= 2 && p.grid >= 2 && p.grid + p.grid % 2 <= sm_count;
  if (p.placement_pairs) p.grid += p.grid % 2;
  t.loop = main_loop_for(t, p.kb_per_split);
  p.workspace_bytes = fp8gemm::split_workspace_bytes(p.splits, m, n);
  return p;
}

// ---- The weight-gradient GEMM (wgrad_launch.cuh): one of tile_config.hpp kWgradTiles, never split along K.
//
// Its shapes are hidden sizes by hidden sizes (M, N 1536..36864) over the tokens of a step (K 2048..16384): hundreds
// to thousands of 128 x 128 tiles, so the tile is chosen by the same wave model as the dense GEMM's, at the rates the
// weight-gradient kernels reached on an H200 (fp32 out, DeepGEMM's and Llama-3-8B's weight-gradient shapes at 4096
// tokens, each tile forced): the two-warpgroup tiles with TMA stores 128 x 160 at 922-1011 TFLOP/s where its waves
// fill, 128 x 192 up to 981, 128 x 128 up to 937; 192 x 128 with direct stores up to 935, taken where its rows fill
// the waves. The 256 x 128 pairs (up to 862) lost on every shape and are not compiled.
// No split-K: an accumulating GEMM would need its partial sums reduced into out, and on these shapes the tiles fill
// the SMs without it; a small M x N (a LoRA adapter) takes one wave of long tiles.
struct WgradPlan {
  TileConfig tile;
  int m_blocks, n_blocks;
  int grid;     // persistent CTAs
  int group_m;  // rasterisation, as Plan's
};

constexpr TileRate kWgradRates[] = {{128, 128, 1, 930}, {192, 128, 1, 930}, {128, 160, 1, 1000}, {128, 192, 1, 980}};

// K-grouped bf16 out with at most this many tokens per expert: a tile contracts a few K blocks and its store sets the
// pace, so the plan takes the 128 x 128 tile, which stores bf16 through TMA (kernel_traits.cuh kTmaStore) and was
// measured there.
constexpr int64_t kTmaStoreMaxTokens = 1024;

// `experts` > 1: a k-grouped launch, that many (m, n) products of about k tokens each in one grid; `tma_store`: its
// bf16 out can take TMA stores (wgrad_launch.cuh tma_store_fits).
inline WgradPlan wgrad_plan_for(int64_t m, int64_t n, int64_t k, int sm_count, int64_t experts = 1,
                                bool tma_store = false) {
  WgradPlan p{};
  double best = 0;
  const bool store_bound = experts > 1 && tma_store && k <= kTmaStoreMaxTokens;
  for (const TileRate& t : kWgradRates) {
    const int64_t n_blocks = ceil_div(n, t.cols);
    if ((m <= 128 && t.rows > 128) || (t.cluster > 1 && (n_blocks < t.cluster || sm_count < t.cluster))) continue;
    if (store_bound && (t.rows != 128 || t.cols != 128)) continue;
    // k-grouped bf16 stores through TMA take 64-column boxes; 128 x 160 stores directly and took 1.06x the 128 x 192's
    // time (H200, 32 experts of 4096 tokens, N 4096, K 7168)
    if (experts > 1 && tma_store && t.cols % 64) continue;
    const int64_t tiles = tiles_of(m, n, t.rows, t.cols, t.cluster) * experts;
    const double us = double(ceil_div(tiles, sm_count)) * 2.0 * t.rows * t.cols * k / (t.tflops * 1e6 / sm_count);
    if (best == 0 || us < best) best = us, p.tile = TileConfig{t.rows, t.cols, t.cluster, MainLoop::kOneSet};
  }
  const TileConfig& t = p.tile;
  p.m_blocks = static_cast<int>(ceil_div(m, t.rows));
  p.n_blocks = static_cast<int>(ceil_div(n, t.cols));
  const int64_t cluster_tiles = int64_t(p.m_blocks) * ceil_div(p.n_blocks, t.cluster) * experts;  // pairs along N
  p.grid = static_cast<int>(std::min<int64_t>(cluster_tiles, sm_count / t.cluster) * t.cluster);
  p.group_m = kGroupM;
  return p;
}

// The index of `tile` in kWgradTiles, or -1 where no weight-gradient kernel of that shape is compiled.
constexpr int wgrad_tile_index(const TileConfig& tile) {
  for (int i = 0; i < kWgradTileCount; ++i)
    if (kWgradTiles[i].same_kernel(tile)) return i;
  return -1;
}

// ---- Grouped GEMMs (grouped.cu): one of tile_config.hpp kGroupedTiles for the rows a group is expected to hold.

struct GroupedPlan {
  TileConfig tile;
  int64_t row_tiles;  // a bound on the row tiles of every group together (the walk ends at the last real one)
  int64_t n_blocks;
  int64_t grid;  // persistent CTAs
};

// The dense model's rates for the grouped kernels' shapes.
constexpr TileRate kGroupedRates[] = {{64, 128, 1, 690},   {128, 128, 1, 1120}, {128, 192, 1, 1150},
                                     {192, 128, 1, 1220}, {256, 128, 2, 1270}};

// Row tiles the walk can meet. Masked: every group's tiles of M_max rows. Contiguous: a group's tiles start at its
// first row rounded down to 4 (scheduler.cuh GroupCursor), so each non-empty group adds at most two partial tiles.
// Row ids: each run is such a group, up to one a row (fp8gemm::grouped_segments), never counted on the host.
inline int64_t grouped_row_tile_bound(bool masked, int64_t m, int64_t groups, int rows) {
  return masked ? groups * ceil_div(m, rows) : ceil_div(m, rows) + 2 * std::min(groups, m);
}

// Real groups hold 0.7-1.3x the hint (DeepGEMM's tests draw masked_m so): a tile whose row tiles just fill a wave
// at the hint runs two waves at 1.15x it (1 x 1172 rows on 256 x 128 pairs: 108 us, against 48 us for the dense
// GEMM of those rows). So each candidate is judged by its slowest modelled time over the hint's spread: on the
// grouped benchmark's DeepGEMM shapes (H100) that pick is 1.045x the fastest compiled kernel per case (geomean),
// the mean over the spread 1.068x (docs/kernels/sm90a.md, "Grouped tile choice").
constexpr double kHintSpread[] = {0.7, 0.85, 1.0, 1.15, 1.3};

// The rest of a grouped plan once its tile (main loop included) is chosen: row tiles, N blocks and the grid.
inline GroupedPlan grouped_plan_with(const TileConfig& tile, bool masked, int64_t m, int64_t n, int64_t groups,
                                     int sm_count, bool row_ids = false) {
  GroupedPlan p{};
  p.tile = tile;
  p.n_blocks = ceil_div(n, p.tile.cols);
  p.row_tiles = grouped_row_tile_bound(masked, m, row_ids ? m : groups, p.tile.rows);
  const int cluster = p.tile.cluster;  // the grid counts whole clusters
  p.grid = std::min<int64_t>(p.row_tiles * ceil_div(p.n_blocks, cluster), sm_count / cluster) * cluster;
  return p;
}

// The candidate whose slowest modelled time over the spread is smallest, for `groups` groups of about the hinted rows
// each (whole waves of tiles at the tile's rate); 64-row tiles only for groups of up to 64 rows (decode), where taller ones compute padding.
inline GroupedPlan grouped_plan_for(bool masked, int64_t m, int64_t n, int64_t k, int64_t groups, int64_t expected_m,
                                    int sm_count, bool row_ids = false) {
  const int64_t hint = std::max<int64_t>(1, fp8gemm::grouped_rows_hint(masked, m, groups, expected_m));
  TileConfig best_tile{};
  double best = 0;
  for (const TileRate& t : kGroupedRates) {
    const int64_t n_blocks = ceil_div(n, t.cols);
    if ((hint <= 64 && t.rows > 64) || (t.cluster > 1 && (n_blocks < t.cluster || sm_count < t.cluster))) continue;
    double us = 0;
    for (const double spread : kHintSpread) {
      const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(hint * spread));
      const int64_t tiles = groups * ceil_div(rows, t.rows) * ceil_div(n_blocks, t.cluster) * t.cluster;
      us = std::max(us, double(ceil_div(tiles, sm_count)) * 2.0 * t.rows * t.cols * k / (t.tflops * 1e6 / sm_count));
    }
    if (best == 0 || us < best) best = us, best_tile = TileConfig{t.rows, t.cols, t.cluster, MainLoop::kTwoSets};
  }
  best_tile.loop = main_loop_for(best_tile, static_cast<int>(k / kBlockK));
  return grouped_plan_with(best_tile, masked, m, n, groups, sm_count, row_ids);
}

// The index of `tile` in kGroupedTiles, or -1 where no grouped kernel of that shape is compiled.
constexpr int grouped_tile_index(const TileConfig& tile) {
  for (int i = 0; i < kGroupedTileCount; ++i)
    if (kGroupedTiles[i].same_kernel(tile)) return i;
  return -1;
}

}  // namespace fp8gemm_sm90a
