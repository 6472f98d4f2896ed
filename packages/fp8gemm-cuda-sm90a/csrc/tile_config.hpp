// The kernels this package compiles: one list of typed tile configurations that the launch dispatch, the
// plan (heuristics.hpp), build_info's "tiles" (module.cpp) and the tests all read. Plain C++.
#pragma once

namespace fp8gemm_sm90a {

constexpr int kBlockK = 128;  // = scale block: one promotion per pipeline stage
// The one-set loop runs its unrolled copy on B-scale segments of at least this many K blocks
// (kernel_traits.cuh kAlwaysUnrolled); 128 x 128 tiles take that loop from as many K blocks per split.
constexpr int kUnrolledMinKb = 24;

// How the consumer warpgroups run through K (docs/kernels/sm90a-structure.md).
enum class MainLoop : int {
  kTwoSets = 0,          // two accumulator sets: block i + 1 is issued while block i is promoted (up to 128 columns)
  kOneSet = 1,           // one set, B scales from shared-memory segments a producer warp fills ahead
  kSplitWarpgroups = 2,  // two warpgroups on one 64-row tile take alternate K blocks (each with two sets)
};

// ptxas options of the translation unit a tile is compiled in (CMakeLists.txt).
enum class Unit : int {
  kDefault = 0,         // tiles.cu
  kRegisterLevel10 = 1  // tiles_register_level10.cu: --register-usage-level=10, measured faster on these tiles
};

// What a kernel multiplies (DeepGEMM's GemmType): one GEMM, or one per group of rows (mixture of experts) whose
// tiles never cross a group (scheduler.cuh GroupedTiles), or the weight-gradient GEMM (wgrad_launch.cuh): B scales
// per column of the tile (1 x 128 along K, "1D1D") instead of per 128 x 128 block, fp32 out, optionally added into.
// kKGroupedWgrad: the weight-gradient kernel with one split per expert (wgrad_launch.cuh).
enum class GemmType : int { kDense = 0, kGrouped = 1, kWgrad = 2, kKGroupedWgrad = 3 };

struct TileConfig {
  int rows;     // BLOCK_M: 64, 128, 192 or 256 (two warpgroups of two 64-row slices)
  int cols;     // BLOCK_N: a multiple of 16 up to 192
  int cluster;  // CTAs per cluster: 2 multicasts the shared operand (A along N for 256 rows, else B along M)
  MainLoop loop;
  Unit unit = Unit::kDefault;

  constexpr int slices() const { return rows / 64; }  // 64-row wgmma slices
  constexpr bool same_kernel(const TileConfig& o) const {
    return rows == o.rows && cols == o.cols && cluster == o.cluster && loop == o.loop;
  }
};

constexpr TileConfig kTiles[] = {
    {64, 16, 1, MainLoop::kTwoSets},
    {64, 32, 1, MainLoop::kTwoSets},
    {64, 64, 1, MainLoop::kTwoSets},
    {64, 96, 1, MainLoop::kTwoSets},
    {64, 128, 1, MainLoop::kTwoSets},
    {128, 64, 1, MainLoop::kTwoSets},
    {128, 96, 1, MainLoop::kTwoSets, Unit::kRegisterLevel10},
    {128, 128, 1, MainLoop::kTwoSets},
    {128, 160, 1, MainLoop::kOneSet},
    {128, 192, 1, MainLoop::kOneSet},
    {192, 128, 1, MainLoop::kOneSet},
    {256, 128, 1, MainLoop::kOneSet},
    {256, 128, 2, MainLoop::kOneSet},
    // The same shapes on another main loop, for long K (heuristics.hpp one_set_loop, split_k_warpgroups).
    {128, 128, 1, MainLoop::kOneSet},
    {64, 16, 1, MainLoop::kSplitWarpgroups, Unit::kRegisterLevel10},
    {64, 32, 1, MainLoop::kSplitWarpgroups, Unit::kRegisterLevel10},
};
constexpr int kTileCount = sizeof(kTiles) / sizeof(kTiles[0]);

// The grouped kernels (grouped.cu): decode groups on 64-row tiles, then 128 (128 or 192 wide), 192 and 256 rows; clusters only pair
// N blocks (two M blocks may lie in different groups).
constexpr TileConfig kGroupedTiles[] = {
    {64, 128, 1, MainLoop::kTwoSets},
    {128, 128, 1, MainLoop::kTwoSets},
    {128, 128, 1, MainLoop::kOneSet},
    {128, 192, 1, MainLoop::kOneSet},  // few groups: 2/3 the row tiles of 128 x 128 where N fills a wave poorly
    {192, 128, 1, MainLoop::kOneSet},
    {256, 128, 2, MainLoop::kOneSet},  // pairs of N blocks multicast the rows of A they share
};
constexpr int kGroupedTileCount = sizeof(kGroupedTiles) / sizeof(kGroupedTiles[0]);

// The weight-gradient kernels (wgrad_launch.cuh, GemmType::kWgrad): hidden sizes by hidden sizes over thousands of
// tokens, so only the wide one-set tiles: two warpgroups of 128 to 192 columns, whose epilogue stores through TMA,
// and three of 128 (direct stores) where its 192 rows fill the waves better.
constexpr TileConfig kWgradTiles[] = {
    {128, 128, 1, MainLoop::kOneSet},
    {192, 128, 1, MainLoop::kOneSet},
    {128, 160, 1, MainLoop::kOneSet},
    {128, 192, 1, MainLoop::kOneSet},
};
constexpr int kWgradTileCount = sizeof(kWgradTiles) / sizeof(kWgradTiles[0]);

// The index of `tile` in kTiles, or -1 where it is not compiled.
constexpr int tile_index(const TileConfig& tile) {
  for (int i = 0; i < kTileCount; ++i)
    if (kTiles[i].same_kernel(tile)) return i;
  return -1;
}

// Which way a 2-CTA cluster pairs tiles: 256-row tiles along N (sharing A), the others along M (sharing B).
constexpr bool pairs_along_n(int rows) { return rows == 256; }

}  // namespace fp8gemm_sm90a
