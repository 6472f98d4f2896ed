// Host side of the grouped GEMMs: checks the sizes (fp8gemm/grouped_launch.hpp), picks the tile
// (heuristics.hpp grouped_plan_for), encodes 3-D tensor maps whose third coordinate is the group and launches the
// grouped kernel (gemm_kernel with GemmType::kGrouped) once on the caller's stream. Row ids (m_indices) take the
// contiguous layout's maps, with the runs found on the device (run_ring.cuh): no read of the ids here.
#include <utility>

#include "fp8gemm/grouped_launch.hpp"
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {
namespace {

// A: [groups][rows][k]; contiguous: one group of all M rows (its group stride is never stepped over).
template <int kIndex>
void launch_grouped_tile(const fp8gemm::GroupedArgs& a, Params p, const GroupedPlan& plan, cudaStream_t stream, int dev) {
  constexpr TileConfig kTile = kGroupedTiles[kIndex];
  constexpr int kCluster = kTile.cluster;
  using C = KernelTraits<kTile.rows, kTile.cols, kCluster, kTile.loop, GemmType::kGrouped>;
  constexpr auto kernel = gemm_kernel<kTile.rows, kTile.cols, kCluster, kTile.loop, GemmType::kGrouped>;
  kDevices.allow_shared_memory<kernel>(dev, C::kSmemBytes);
  const bool masked = a.layout == fp8gemm::kGroupedMasked;
  const int64_t rows = a.m, a_groups = masked ? a.groups : 1, kb = a.k / kBlockK;
  // As the dense launch: rows of A fewer than a tile are loaded as a box of just those rows; a cluster's CTAs
  // load half of the tile's rows each (whole boxes) and multicast them.
  const bool short_a = kCluster == 1 && rows < C::kBlockM;
  const int rows_a = short_a ? static_cast<int>(rows) : C::kBlockM / kCluster;
  const int scales_a = short_a ? round_up_to_4_rows(rows_a) : C::kBlockM;
  const auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const auto a_gs = masked ? a.a_group_stride : rows * a.lda;
  const auto sa_gs = masked ? a.a_scale_group_stride : kb * a.a_scale_ld;
  const int64_t ldo = a.out_kind == fp8gemm::kOutFP32 ? 2 * a.ldo : a.ldo;  // fp32 out is stored directly
  const int64_t out_gs = (masked ? a.out_group_stride : rows * a.ldo) * (a.out_kind == fp8gemm::kOutFP32 ? 2 : 1);
  const CUtensorMap map_a = make_map_3d(reinterpret_cast<void*>(a.a), u8, 1, a.k, rows, a_groups, a.lda, a_gs, kBlockK,
                                        rows_a, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap map_b = make_map_3d(reinterpret_cast<void*>(a.b), u8, 1, a.k, a.n, a.groups, a.ldb,
                                        a.b_group_stride, kBlockK, kTile.cols, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap map_s = make_map_3d(reinterpret_cast<void*>(a.a_scale), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, rows,
                                        kb, a_groups, a.a_scale_ld, sa_gs, scales_a, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap map_out = make_map_3d(reinterpret_cast<void*>(a.out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.n,
                                          rows, a_groups, ldo, out_gs, 64, 64 * C::kSub, CU_TENSOR_MAP_SWIZZLE_128B);
  p.tx_bytes = (short_a ? rows_a * kBlockK : C::kABytes) + C::kBBytes + scales_a * 4;
  LaunchConfig launch(static_cast<int>(plan.grid), C::kThreads, C::kSmemBytes, stream);
  if constexpr (kCluster > 1) {  // persistent: no more clusters than can be resident at once
    launch.attrs[0].val.clusterDim.x = kCluster;
    const int resident = resident_pairs<kernel>(launch.config, dev);
    if (!resident) kDevices.fail("no 2-CTA cluster fits on this GPU");
    launch.config.gridDim = dim3(std::min<int64_t>(plan.grid / 2, resident) * 2);  // the plan's grid is even
  }
  kDevices.check(cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, map_s, map_out, map_s, p),
                 "grouped GEMM kernel launch");
}

template <int... kIndex>
void launch_grouped_index(int index, const fp8gemm::GroupedArgs& a, const Params& p, const GroupedPlan& plan,
                          cudaStream_t stream, int dev, std::integer_sequence<int, kIndex...>) {
  using Launch = void (*)(const fp8gemm::GroupedArgs&, Params, const GroupedPlan&, cudaStream_t, int);
  static constexpr Launch kLaunches[] = {&launch_grouped_tile<kIndex>...};
  if (index < 0 || index >= kGroupedTileCount) kDevices.fail("the grouped plan names a tile that is not compiled");
  kLaunches[index](a, p, plan, stream, dev);
}

}  // namespace

void grouped_launch_tile(const fp8gemm::GroupedArgs& args, int tile_index) {
  if (!fp8gemm::grouped_launch_has_work(args, kDevices.package(), /*row_ids=*/true)) return;
  const bool masked = args.layout == fp8gemm::kGroupedMasked, row_ids = args.layout == fp8gemm::kGroupedRowIds;
  const int dev = kDevices.current();
  const int sms = kDevices.sm_count(dev);
  const GroupedPlan plan =
      tile_index < 0 ? grouped_plan_for(masked, args.m, args.n, args.k, args.groups, args.expected_m, sms, row_ids)
                     : grouped_plan_with(kGroupedTiles[tile_index], masked, args.m, args.n, args.groups, sms, row_ids);
  fp8gemm::check_grouped_tiles(plan.row_tiles, plan.n_blocks, plan.grid, kDevices.package());
  Params p{};
  p.out = reinterpret_cast<void*>(args.out);
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.ldo = args.ldo, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == fp8gemm::kOutFP32;
  p.kb_per_split = p.k / kBlockK, p.splits = 1;
  p.n_blocks = static_cast<int>(plan.n_blocks);  // the row tiles' bound stays on the host (check_grouped_tiles)
  p.group_rows = reinterpret_cast<const int32_t*>(args.group_rows);
  p.groups = static_cast<int>(args.groups), p.masked = masked, p.row_ids = row_ids;
  p.sb_gs = args.b_scale_group_stride, p.out_gs = masked ? args.out_group_stride : 0;
  launch_grouped_index(grouped_tile_index(plan.tile), args, p, plan, reinterpret_cast<cudaStream_t>(args.stream), dev,
                       std::make_integer_sequence<int, kGroupedTileCount>());
  kDevices.check(cudaGetLastError(), "grouped GEMM kernel launch");
}

void grouped_launch(const fp8gemm::GroupedArgs& args) { grouped_launch_tile(args, -1); }

}  // namespace fp8gemm_sm90a
