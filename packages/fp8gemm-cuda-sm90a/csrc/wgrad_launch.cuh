// Host side of the weight-gradient GEMM (fp8gemm/training_entries.hpp, fp8gemm/backend.hpp WgradArgs): the plan
// (heuristics.hpp wgrad_plan_for), the tensor maps and the launch of a GemmType::kWgrad gemm_kernel on the caller's
// stream. It is the dense kernel with two differences: each stage also holds the B scales of the tile's columns for its
// K block (TMA from the MN-major [K/128, N] per-row scales, as A's), which each thread applies to its own accumulator
// columns (consumer.cuh promote_columns); and the epilogue of the two-warpgroup tiles stages fp32 out in shared memory
// for TMA stores, or TMA reduce-adds with args.accumulate (epilogue.cuh epilogue_f32_tma), and bf16 as the forward's;
// the 192-row tile stores directly.
//
// K is the token count, a multiple of 128 (the core guarantees it; fp8gemm.training.quantize_with_transpose
// zero-pads x^T and dY^T to a whole 128-token block, and zero codes add nothing to any dot product).
// The k-grouped entry (KGroupedWgradArgs) runs the same tiles as GemmType::kKGroupedWgrad, one split per expert: each CTA first copies the
// experts' clamped token ends into shared memory, and a tile of expert e contracts e's own K blocks into out[e].
//
// Compiled in wgrad.cu.
#pragma once

#include <algorithm>
#include <type_traits>

#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {
namespace {

// Whether a k-grouped call's bf16 out [experts, m, n] suits a TMA store map: 16-byte aligned base and strides.
inline bool tma_store_fits(const fp8gemm::KGroupedWgradArgs& a) {
  return a.out_kind == fp8gemm::kOutBF16 && !a.accumulate && a.out % 16 == 0 && a.ldo % 8 == 0 && a.out_es % 8 == 0;
}
inline bool tma_store_fits(const fp8gemm::WgradArgs& a) {
  return a.out_kind == fp8gemm::kOutBF16 && !a.accumulate && a.out % 16 == 0 && a.ldo % 8 == 0;
}
// Whether fp32 out (stored or added into) suits a TMA map: 16-byte aligned base and strides.
template <class Args>
bool f32_tma_store_fits(const Args& a) {
  if constexpr (std::is_same_v<Args, fp8gemm::KGroupedWgradArgs>)
    if (a.experts > 1 && a.out_es % 4) return false;
  return a.out_kind == fp8gemm::kOutFP32 && a.out % 16 == 0 && a.ldo % 4 == 0;
}

// The output's tensor map: [m, n] rows ldo apart, or k-grouped [experts, m, n] (expert e at e * out_es).
template <class Args>
CUtensorMap out_map(const Args& a, CUtensorMapDataType type, int elem_bytes, uint32_t box_cols, uint32_t box_rows,
                    CUtensorMapSwizzle swizzle) {
  void* out = reinterpret_cast<void*>(a.out);
  if constexpr (std::is_same_v<Args, fp8gemm::KGroupedWgradArgs>)
    return make_map_3d(out, type, elem_bytes, a.n, a.m, a.experts, a.ldo, a.out_es, box_cols, box_rows, swizzle);
  else
    return make_map(out, type, elem_bytes, a.n, a.m, a.ldo, box_cols, box_rows, swizzle);
}

// Args: fp8gemm::WgradArgs or fp8gemm::KGroupedWgradArgs (the same operand fields).
template <int kIndex, class Args>
void launch_wgrad_tile(const Args& a, Params p, const WgradPlan& plan, cudaStream_t stream, int dev) {
  constexpr TileConfig kTile = kWgradTiles[kIndex];
  constexpr int kBlockN = kTile.cols, kCluster = kTile.cluster;
  static_assert(kCluster == 1, "weight-gradient tiles launch without clusters");
  constexpr GemmType kType =
      std::is_same_v<Args, fp8gemm::KGroupedWgradArgs> ? GemmType::kKGroupedWgrad : GemmType::kWgrad;
  using C = KernelTraits<kTile.rows, kTile.cols, kCluster, kTile.loop, kType>;
  constexpr auto kernel = gemm_kernel<kTile.rows, kTile.cols, kCluster, kTile.loop, kType>;
  kDevices.allow_shared_memory<kernel>(dev, C::kSmemBytes);
  const auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8, f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  // As the dense launch: a tile taller than M loads just its rows (and their scales, a 16-byte box); the 256-row
  // pairs load half of the tile's rows each and multicast them.
  constexpr int kRowsA = C::kAlongN ? C::kBlockM / kCluster : C::kBlockM;
  const bool short_a = !C::kAlongN && a.m < C::kBlockM;
  const int rows_a = short_a ? static_cast<int>(a.m) : kRowsA;
  const int scales_a = short_a ? round_up_to_4_rows(rows_a) : C::kBlockM;
  const int64_t kb = a.k / kBlockK;
  const CUtensorMap map_a = make_map(reinterpret_cast<void*>(a.a), u8, 1, a.k, a.m, a.lda, kBlockK, rows_a,
                                     CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap map_b = make_map(reinterpret_cast<void*>(a.b), u8, 1, a.k, a.n, a.ldb, kBlockK, kBlockN,
                                     CU_TENSOR_MAP_SWIZZLE_128B);
  // Both scales MN-major: row kb holds the scales of every M row (A) or N row (B) for that K block. A tile's B box
  // reaching past N (N % 128 != 0, a cluster's padding tile) reads zeros there, for columns that are never stored.
  const CUtensorMap map_s = make_map(reinterpret_cast<void*>(a.a_scale), f32, 4, a.m, kb, a.a_scale_ld, scales_a, 1,
                                     CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap map_sb = make_map(reinterpret_cast<void*>(a.b_scale), f32, 4, a.n, kb, a.b_scale_ld, kBlockN, 1,
                                      CU_TENSOR_MAP_SWIZZLE_NONE);
  p.tx_bytes = (short_a ? rows_a * kBlockK : C::kABytes) + C::kBBytes + scales_a * 4 + C::kSBBytes;
  p.order = make_tile_order(m_groups_of<kCluster, C::kAlongN>(p), n_groups_of<kCluster, C::kAlongN>(p), plan.group_m);
  LaunchConfig launch(plan.grid, C::kThreads, C::kSmemBytes, stream);
  // The output map: out that TMA can address (bf16 as the forward's epilogue stores it; fp32 in boxes of 32 columns),
  // else the B scales' map again (stored directly, never read).
  CUtensorMap map_out = map_sb;
  if constexpr (C::kTmaStore) {
    if (tma_store_fits(a)) {
      static_assert(C::kWideStore || kType == GemmType::kWgrad, "k-grouped bf16 stores: 64-column boxes");
      map_out = out_map(a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, C::kWideStore ? 64 : 32, 64 * C::kSub,
                        C::kWideStore ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
      p.store_tma = 1;
    }
  }
  if constexpr (C::kF32TmaStore) {
    if (f32_tma_store_fits(a)) {
      map_out = out_map(a, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 32, 64, CU_TENSOR_MAP_SWIZZLE_128B);
      p.store_tma = 1;
    }
  }
  kDevices.check(cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, map_s, map_out, map_sb, p),
                 "weight-gradient GEMM kernel launch");
}

template <class Args, int... kIndex>
void launch_wgrad_index(int index, const Args& a, const Params& p, const WgradPlan& plan, cudaStream_t stream, int dev,
                        std::integer_sequence<int, kIndex...>) {
  using Launch = void (*)(const Args&, Params, const WgradPlan&, cudaStream_t, int);
  static constexpr Launch kLaunches[] = {&launch_wgrad_tile<kIndex, Args>...};
  if (index < 0 || index >= kWgradTileCount) kDevices.fail("the weight-gradient plan names a tile that is not compiled");
  kLaunches[index](a, p, plan, stream, dev);
}

static_assert(kKGroupedExperts == fp8gemm::kKGroupedMaxExperts, "the k-grouped kernels' shared table of token ends");

// The checks and Params both entries share; `experts` 0 for one GEMM.
template <class Args>
Params wgrad_params(const Args& args, const char* entry, int64_t experts) {
  if (const char* why = fp8gemm::wgrad_args_refusal(args)) kDevices.fail(std::string(entry) + ": " + why);
  Params p{};
  p.out = reinterpret_cast<void*>(args.out);
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.ldo = args.ldo, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == fp8gemm::kOutFP32, p.accumulate = args.accumulate != 0;
  p.kb_per_split = p.k / kBlockK, p.splits = experts ? static_cast<int>(experts) : 1;
  return p;
}

template <class Args>
void launch_wgrad_plan(const Args& args, Params p, const WgradPlan& plan, int dev) {
  p.m_blocks = plan.m_blocks, p.n_blocks = plan.n_blocks;
  launch_wgrad_index(wgrad_tile_index(plan.tile), args, p, plan, reinterpret_cast<cudaStream_t>(args.stream), dev,
                     std::make_integer_sequence<int, kWgradTileCount>());
  kDevices.check(cudaGetLastError(), "weight-gradient GEMM kernel launch");
}

}  // namespace

int64_t wgrad_workspace_bytes(int64_t, int64_t, int64_t) { return 0; }  // never split along K

void wgrad_launch(const fp8gemm::WgradArgs& args) {
  const Params p = wgrad_params(args, "wgrad_launch", 0);
  const int dev = kDevices.current();
  launch_wgrad_plan(args, p, wgrad_plan_for(args.m, args.n, args.k, kDevices.sm_count(dev)), dev);
}

void kgrouped_wgrad_launch(const fp8gemm::KGroupedWgradArgs& args) {
  if (args.experts < 1 || args.experts > kKGroupedExperts || args.k < kBlockK * (args.experts + 1))
    kDevices.fail("kgrouped_wgrad_launch: 1 <= experts <= " + std::to_string(kKGroupedExperts) +
                  " and k >= 128 * (experts + 1) (the per-expert aligned layout) are required");
  Params p = wgrad_params(args, "kgrouped_wgrad_launch", args.experts);
  p.group_rows = reinterpret_cast<const int32_t*>(args.offs);
  p.groups = static_cast<int>(args.experts), p.out_gs = args.out_es;
  const int dev = kDevices.current();
  // The plan's K per expert: the layout's columns less one gap block per expert, shared evenly.
  const int64_t k_each = std::max<int64_t>(kBlockK, (args.k - kBlockK * args.experts) / args.experts);
  const WgradPlan plan = wgrad_plan_for(args.m, args.n, k_each, kDevices.sm_count(dev), args.experts, tma_store_fits(args));
  launch_wgrad_plan(args, p, plan, dev);
}

}  // namespace fp8gemm_sm90a
