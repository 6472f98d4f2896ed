// Shape heuristics for the sm_90a kernel, in one place: tile shape, K splits, grid size.
// workspace_bytes() and launch() both read plan_for(), so they always agree.
#pragma once
#include <algorithm>
#include <cstdint>

namespace fp8gemm_sm90a {

constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage
// Tile rasterisation: M blocks per group (see plan_for; FP8GEMM_SM90A_GROUP_M overrides).
constexpr int kGroupM = 16;
constexpr int kGroupMOneWave = 2;
constexpr int kGroupMNarrowWave = 4;
// The one-set K loop runs its unrolled copy on B-scale segments of at least this many K blocks
// (gemm_kernel.cuh Cfg::kAlwaysUnrolled), and 128 x 128 tiles take that loop from as many K blocks per
// split (plan_for: one_set_loop).
constexpr int kUnrolledMinKb = 24;
// 64 x 16 and 64 x 32 tiles with at least this many K blocks per split share them out over two warpgroups
// (plan_for: split_k_warpgroups).
constexpr int kWarpgroupSplitMinKb = 48;

// Forced choices for experiments (FP8GEMM_SM90A_TILE="consumers,block_n[,cluster]",
// FP8GEMM_SM90A_SPLITS=n, FP8GEMM_SM90A_GROUP_M=n, FP8GEMM_SM90A_NO_PAIRS=1,
// FP8GEMM_SM90A_WG_SPLIT_MIN_KB=n); 0 leaves the choice to the policy.
struct Tuning {
  int consumers = 0, block_n = 0, cluster = 0, splits = 0, group_m = 0, no_pairs = 0;
  int wg_split_min_kb = 0;  // split_k_warpgroups' threshold in K blocks per split
};

struct Plan {
  int consumers;  // 64-row slices: BLOCK_M = 64 * consumers (one consumer warpgroup each; 4: two of two)
  int block_n;    // tile width: 16, 32, 64, 96, 128, 160 or 192 (tile_supported)
  int cluster;    // CTAs per cluster: along N sharing A for 256-row tiles, else along M sharing B
  int m_blocks, n_blocks, splits, kb_per_split;
  int grid;  // persistent CTAs
  int group_m;  // rasterisation: cluster tiles are walked in groups of group_m M blocks, M fastest
  bool placement_pairs;  // 1-CTA tiles launched as 2-CTA clusters, for placement only (plan_for)
  bool one_set_loop;     // 128 x 128 tiles: the one-set K loop instead of the two-set one (plan_for)
  bool split_k_warpgroups;  // 64 x 16 and 64 x 32 tiles: two warpgroups take alternate K blocks (plan_for)
  int64_t workspace_bytes;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tile shapes launch.cu (with launch_128x96.cu and launch_64xn_split.cu) instantiates.
inline bool tile_supported(int consumers, int block_n, int cluster) {
  if (cluster == 2) return (consumers == 2 || consumers == 4) && block_n == 128;
  if (cluster != 1) return false;
  switch (consumers) {
    case 1: return block_n == 16 || block_n == 32 || block_n == 64 || block_n == 96 || block_n == 128;
    case 2: return block_n == 64 || block_n == 96 || block_n == 128 || block_n == 160 || block_n == 192;
    case 3: return block_n == 128;
    case 4: return block_n == 128;  // 256-row tiles: two warpgroups of two 64-row slices
    default: return false;
  }
}

// Split-K: when the tiles cannot fill the SMs, K is split (fp32 partials + a reduction launch)
// until about one wave of CTAs runs, keeping >= 2 K blocks per split.
inline int splits_for(int64_t tiles, int kb_total, int sm_count) {
  if (tiles >= sm_count || tiles == 0) return 1;
  return static_cast<int>(std::clamp<int64_t>(sm_count / tiles, 1, std::max(1, kb_total / 2)));
}

// Candidate tiles with the rate each sustained on an H200 (TFLOP/s): wider tiles reuse each loaded
// byte more, so they run faster per tile but leave more of the last wave idle or force more K splits
// on small problems. Fitted (log least squares, then nudged to minimise the chosen tile's loss) to
// one sweep of every tile over the 21 benchmark shapes (bench/results/sm90a_tile_sweeps_h200_*.json,
// "6_refit"); with these rates the chosen tile is the fastest measured one on 20 of the 21 shapes.
// 256 x 128 tiles came later ("7_256_rows": +3-5% over 128 x 192 and 128 x 128 where the waves fit
// alike); reading their B scales from the stage made them 3-11% faster again (bench/NOTES.md), so they
// now rate above 128 x 192 on every large shape whose waves they fill.
// The eleventh session added 128 x 96 and 128 x 160 (they fill the waves of N = 1536, 2112, 4096,
// 18432, 576, ...) and rated 192 x 128 by what it sustains streaming whole K: one sweep of every
// 128- and 192-row tile on 18 shapes plus an A/B of the changed plans on 23 more
// ("17_eleventh_session"). In K splits 192 x 128 keeps its old rate: rated 1220 there it took
// 160x2112x7168 and 192x4096x7168 from the 64- and 128-row tiles and lost 11-14%. Then 64 x 96 for
// decode at N = 18432 and 24576 (+1-9%, run_d), rated just below where it would tie the 2 x 64 tile
// at 160-384 rows (measured up to 15% slower there).
// Only the ranking matters: the fixed cost is the same for every candidate.
struct TileRate {
  int consumers, block_n, cluster;
  double tflops;
  double split_tflops = 0;  // the rate in K splits, where it differs
};
constexpr TileRate kTileRates[] = {
    {1, 16, 1, 300}, {1, 32, 1, 450}, {1, 64, 1, 615}, {1, 96, 1, 620}, {1, 128, 1, 690},  // 64-row tiles
    {2, 64, 1, 840}, {2, 96, 1, 880}, {2, 128, 1, 1120}, {2, 160, 1, 1100}, {2, 192, 1, 1150},  // 128-row tiles
    {3, 128, 1, 1220, 1050},  // 192-row tiles
    {4, 128, 1, 1230},  // 256-row tiles: +4-5% over 128 x 192 at 8192^3 and 4096x32768x512 when rated
    // 256-row tiles in 2-CTA clusters along N multicasting A (DeepGEMM's layout here): once the store
    // warp and the B-scale segments were in, +2% over 4,128 (geomean of seven M >= 4096 shapes) on two
    // of three machines, a loss on three shapes on the third ("14_eighth_session").
    {4, 128, 2, 1270},
};

// Which way a 2-CTA cluster pairs tiles (gemm_kernel.cuh Cfg::kAlongN reads it too): 256-row tiles
// along N (sharing A), the others along M (sharing B).
constexpr bool pairs_along_n(int consumers) { return consumers == 4; }

// Work items of a tile choice: a cluster's tiles are whole pairs, so an odd block count along the
// paired dimension computes one padding block.
inline int64_t tiles_of(int64_t m, int64_t n, int consumers, int block_n, int cluster) {
  int64_t m_blocks = ceil_div(m, 64 * consumers), n_blocks = ceil_div(n, block_n);
  int64_t& paired = pairs_along_n(consumers) ? n_blocks : m_blocks;
  if (cluster > 1 && paired >= cluster) paired = ceil_div(paired, cluster) * cluster;
  return m_blocks * n_blocks;
}

// Decode batches of up to 128 rows: the tiles stream B at DRAM speed, so K splits buy nothing and
// their reduction decides. At 128x7168x16384 the kernels of 128 x 64 tiles and of 128 x 128 tiles
// in 2 K splits both take 41 us (B at ~2.9 TB/s), the split one then 3 us more for its reduction
// (sweeps "15_ninth_session"). A split candidate is therefore not modelled faster than streaming A,
// B and the output once (3.0 TB/s: at 2.9 the model flips 65x8192x28672 from 2 x 192 in 3 splits to
// 2 x 128 in 2, measured 12% slower then). Unsplit candidates are not floored: that lost 12% at
// 65x8192x28672 and 5% at 128x28672x4096. Tiles taller than M load only its rows (launch_tiles.cuh), so
// their padding costs nothing beyond the compute. Against the rules before (the floor only for
// 65-128 rows and streams of >= 20 us, a compute penalty for padded rows) this changes 55 shapes of
// a grid of 360, 54 measured (sweeps "16_tenth_session"): 65-128 rows geomean 1.04x (128 x 64 tiles
// unsplit 8-13% faster at N x K >= 7168 x 8192; one loss, 65x2112x7168 4%), 1-64 rows 1.05x
// (16x4096x7168 +15%, 1x7168x16384 +7%; 64x1536x7168 -3%).
constexpr double kDramBytesPerUs = 3.0e6;

// Modelled run time (us) of one tile choice: whole waves of (tile x K split) work items at the
// tile's rate (see above for decode batches of up to 128 rows), a fixed launch/fill cost, and for
// split-K the reduction launch and its fp32 partials.
inline double modelled_us(int64_t m, int64_t n, int64_t k, const TileRate& t, int sm_count) {
  const int64_t tiles = tiles_of(m, n, t.consumers, t.block_n, t.cluster);
  const int kb_total = static_cast<int>(k / kBlockK);
  const int kb_per_split = static_cast<int>(ceil_div(kb_total, splits_for(tiles, kb_total, sm_count)));
  const int64_t splits = ceil_div(kb_total, kb_per_split);
  const double waves = static_cast<double>(ceil_div(tiles * splits, sm_count));
  const double flops_per_item = 2.0 * 64 * t.consumers * t.block_n * kBlockK * kb_per_split;
  const double tflops = splits > 1 && t.split_tflops > 0 ? t.split_tflops : t.tflops;
  double compute_us = waves * flops_per_item / (tflops * 1e6 / sm_count);
  if (m <= 128 && splits > 1) compute_us = std::max(compute_us, double(m * k + n * k + m * n * 2) / kDramBytesPerUs);
  double us = 2.0 + compute_us;
  if (splits > 1) us += 2.3 + double(splits) * m * n * 4 / 2.1e6;  // partials read at ~2.1 TB/s
  return us;
}

// The policy: the candidate with the smallest modelled time; 64-row tiles only for M <= 64
// (decode), where the taller ones would compute padding. Of the clusters only the 256-row tiles'
// A multicast is rated; B multicast measured no faster (128-row tiles; 64-row tiles at M = 128).
inline void choose_tile(int64_t m, int64_t n, int64_t k, int sm_count, Plan& p) {
  double best = 0;
  for (const TileRate& t : kTileRates) {
    if (m <= 64 && t.consumers > 1) continue;
    const double us = modelled_us(m, n, k, t, sm_count);
    if (best == 0 || us < best) best = us, p.consumers = t.consumers, p.block_n = t.block_n, p.cluster = t.cluster;
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

inline Plan plan_for(int64_t m, int64_t n, int64_t k, int sm_count, const Tuning& tuning = {}) {
  Plan p{};
  choose_tile(m, n, k, sm_count, p);
  if (tuning.consumers) p.consumers = tuning.consumers;
  if (tuning.block_n) p.block_n = tuning.block_n;
  if (tuning.cluster) p.cluster = tuning.cluster;
  p.m_blocks = static_cast<int>(ceil_div(m, 64 * p.consumers));
  p.n_blocks = static_cast<int>(ceil_div(n, p.block_n));
  const bool along_n = pairs_along_n(p.consumers);
  if ((along_n ? p.n_blocks : p.m_blocks) < 2) p.cluster = 1;  // nothing to pair
  const int kb_total = static_cast<int>(k / kBlockK);
  const int64_t tiles = int64_t(p.m_blocks) * p.n_blocks;
  int splits = splits_for(tiles, kb_total, sm_count);
  if (tuning.splits) splits = std::clamp(tuning.splits, 1, kb_total);
  p.kb_per_split = static_cast<int>(ceil_div(kb_total, splits));
  p.splits = static_cast<int>(ceil_div(kb_total, p.kb_per_split));  // no empty split
  // The grid counts whole clusters.
  const int64_t cluster_tiles = (along_n ? p.m_blocks * ceil_div(p.n_blocks, p.cluster)
                                         : ceil_div(p.m_blocks, p.cluster) * p.n_blocks) * p.splits;
  p.grid = static_cast<int>(std::min<int64_t>(cluster_tiles, sm_count / p.cluster) * p.cluster);
  // Groups of 16 M blocks keep a wave's A and B blocks few (L2 reuse across waves). When every CTA
  // takes exactly one tile of at most 96 columns, from 4 M blocks up, M blocks walked in pairs
  // measured 7-16% faster (1024x1536x7168, 768x2048x7168, 1024x1024x7168; the order then only
  // places tiles on SMs). Wider single-wave tiles were level or mixed (bench/NOTES.md).
  // Several waves of unclustered, unsplit tiles: groups of 4 where a wave of them touches fewer rows
  // of A and B than with groups of 16 (few N blocks: N = 1536 and 2112 with 192 x 128 or 128 x 192
  // tiles from M = 3072). The footprint ranked six shapes as measured (sweeps "19_thirteenth_session"
  // run_g); on the 36 grid shapes it changes, 1.013x geomean, 1.02x for K >= 2048, 4096x2112x7168
  // 1.04x, 6144x2112x7168 1.04x, lowest 0.97x (4096x2112x512; run_h). The 256 x 128 multicast
  // tiles keep 16: groups of 8, which the footprint prefers there, cost the M = 4096 shapes up to 4%.
  const bool one_wave = p.splits == 1 && cluster_tiles <= sm_count / p.cluster;
  p.group_m = one_wave && p.m_blocks >= 4 && p.block_n <= 96 ? kGroupMOneWave : kGroupM;
  auto footprint = [&](int group) {
    return wave_footprint(p.grid, group, p.m_blocks, p.n_blocks, 64 * p.consumers, p.block_n);
  };
  if (!one_wave && p.splits == 1 && p.cluster == 1 && footprint(kGroupMNarrowWave) < footprint(kGroupM))
    p.group_m = kGroupMNarrowWave;
  if (tuning.group_m) p.group_m = tuning.group_m;
  // Placement pairs: 1-CTA tiles launched in 2-CTA clusters, with no multicast and no cross-CTA
  // barrier. A cluster's two CTAs run on the two SMs of one TPC, and in the tile order above two
  // consecutive tiles are adjacent M blocks of one N block, so they read the same B block at the same
  // time and those reads merge on the way to the L2 (bench/NOTES.md: the L2 request coalescer).
  // Measured against unpaired launches (sweeps "19_thirteenth_session" run_f, H100): 1.03x geomean
  // over 31 shapes, up to 1.16x (768x2048x7168, 128x4096x7168), 1.12x at 96x4096x7168; level with one
  // M block (nothing shared but the small A block; 128x32768x512 0.96), so those stay unpaired. An odd
  // grid gains a CTA that finds no tile, unless that would exceed the SMs. What the pairs win back is
  // the TPC: unpaired launches carry a cluster attribute of 1 (launch_tiles.cuh), which places
  // neighbouring CTAs on different TPCs; a plain launch puts CTAs 2i and 2i + 1 on one TPC by itself and
  // measured level with the pairs (sweeps "30_twenty_fourth_session" run_g;
  // bench/results/sm90a_cta_placement_h200_2026-11-24.txt).
  p.placement_pairs = p.cluster == 1 && p.m_blocks >= 2 && p.grid >= 2 && p.grid + p.grid % 2 <= sm_count &&
                      !tuning.no_pairs;
  if (p.placement_pairs) p.grid += p.grid % 2;
  // 128 x 128 tiles (two warpgroups of one 64-row slice) on long K: the one-set loop, unrolled there
  // (gemm_kernel.cuh Cfg::kOverlap), rather than the two accumulator sets. Measured
  // against the two-set loop (sweeps "21_fifteenth_session" run_d, H100): 1.03-1.04x from 32 K
  // blocks per tile (200x7168x7168 1.044, 129x7168x7168 1.041, 256x8192x8192 1.033, 512x4096x4096
  // 1.033), level at 16 (200x7168x2048 1.008), 0.92x at 12 (640x3072x1536) and 0.98x at 4
  // (128x32768x512). The threshold is the loop's unroll threshold: below it the one-set loop runs
  // rolled. The 64- and 96-wide tiles stay on the two-set loop (run_c: 768x2048x7168 0.96x).
  p.one_set_loop = p.consumers == 2 && p.block_n == 128 && p.cluster == 1 && p.kb_per_split >= kUnrolledMinKb;
  // 64 x 16 tiles on long K: two consumer warpgroups take alternate K blocks (gemm_kernel.cuh
  // Cfg::kSplitWG, with up to 20 stages). Such a tile's consumer needs ~240 SM cycles per K block (a
  // barrier round trip, four dependent wgmma, the promotion: clock64 trace, bench/NOTES.md), longer
  // than its loads take once the producer issues from an elected lane. Measured against one
  // warpgroup (sweeps "24_eighteenth_session" run_e, H200, 3 rounds): 64x2112x16384 1.15x,
  // 64x2112x7168 1.10x, 16x2112x7168 1.08x, 64x1536x7168 1.05x; mixed at 32 K blocks (48x2112x4096,
  // 1x1536x4096: 0.95-1.01x against the same build with the split off), so it starts at 48.
  // 64 x 32 tiles from 48 K blocks too ("25_nineteenth_session" run_b, 6 rounds against the same build
  // with the split off): 1.035-1.047x on the N = 2048-2112 plans of 80-128 rows (two M blocks, placement
  // pairs) and at 1x4096x16384, level (0.99-1.01x) on 64-row N = 3072-4096 plans.
  const int wg_split_min_kb = tuning.wg_split_min_kb ? tuning.wg_split_min_kb : kWarpgroupSplitMinKb;
  p.split_k_warpgroups = p.consumers == 1 && (p.block_n == 16 || p.block_n == 32) && p.cluster == 1 &&
                         p.kb_per_split >= wg_split_min_kb;
  p.workspace_bytes = p.splits > 1 ? int64_t(p.splits) * m * n * int64_t(sizeof(float)) : 0;
  return p;
}

}  // namespace fp8gemm_sm90a
