// Host side of one tile configuration: its tensor maps (TMA descriptors) and its launch. Included by the
// translation units that compile the kernels (tiles.cu, tiles_register_level10.cu), each the tiles of its Unit.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "fp8gemm/cuda/device.hpp"
#include "gemm_kernel.cuh"
#include "launch.hpp"
#include "tile_launch.hpp"

namespace fp8gemm_sm90a {

// Internal linkage: the helpers of a header that several translation units include, each TU with its own
// copies of their function-local statics (the once-per-device cluster occupancy). Another build of the
// module loaded into the same process cannot share them either way: the module exports PyInit__C only
// (the core's fp8gemm_arch_module.cmake).
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm90a");
using fp8gemm::cuda::kMaxDevices;

// cuTensorMapEncodeTiled through the runtime's driver entry point: no link against libcuda.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    kDevices.check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status),
          "cuTensorMapEncodeTiled lookup");
    if (status != cudaDriverEntryPointSuccess || !ptr) kDevices.fail("driver lacks cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// 2-D map over a row-major [rows, cols] matrix with row stride `ld` elements; OOB reads give zeros.
CUtensorMap make_map(const void* base, CUtensorMapDataType type, int elem_bytes, int64_t cols, int64_t rows, int64_t ld,
                     uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * elem_bytes)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_fn()(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) kDevices.fail("cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return map;
}

// 3-D map over `groups` row-major [rows, cols] matrices, `group_ld` elements apart (grouped kernels: the group is
// the third coordinate, so a box never reaches into the next group's rows).
CUtensorMap make_map_3d(const void* base, CUtensorMapDataType type, int elem_bytes, int64_t cols, int64_t rows,
                        int64_t groups, int64_t ld, int64_t group_ld, uint32_t box_cols, uint32_t box_rows,
                        CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(groups)};
  // One group: its stride is never applied, but the encoder still wants it a multiple of 16 bytes (a [1, M, K/128]
  // view of quantize_activation's scales has M floats there).
  const int64_t group_bytes = groups > 1 ? group_ld * elem_bytes : (rows * ld * elem_bytes + 15) / 16 * 16;
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * elem_bytes), static_cast<cuuint64_t>(group_bytes)};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&map, type, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) kDevices.fail("cuTensorMapEncodeTiled (3-D) failed (" + std::to_string(r) + ")");
  return map;
}

// The launch configuration every tile shares: persistent grid, programmatic dependent launch (the CTAs may start
// while the previous grid runs; the kernel waits for it before its first read), cluster dimension 1 (attrs[0]).
struct LaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[2];
  LaunchConfig(const LaunchConfig&) = delete;  // config.attrs points into this object
  LaunchConfig(int grid, int threads, int smem_bytes, cudaStream_t stream) {
    config.gridDim = dim3(grid);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1, attrs[0].val.clusterDim.y = 1, attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attrs;
    config.numAttrs = 2;
  }
};

// 2-CTA clusters of `kKernel` that can be resident at once on device `dev` (asked once per device), or 0.
template <auto kKernel>
int resident_pairs(cudaLaunchConfig_t config, int dev) {
  static std::once_flag asked[kMaxDevices];
  static int resident[kMaxDevices];
  std::call_once(asked[dev], [&] {
    config.gridDim = dim3(2);
    kDevices.check(cudaOccupancyMaxActiveClusters(&resident[dev], kKernel, &config), "cluster occupancy");
  });
  return resident[dev];
}

template <int kIndex>
void launch_tile(const fp8gemm::LaunchArgs& a, Params p, const Plan& plan, cudaStream_t stream, int dev) {
  constexpr TileConfig kTile = kTiles[kIndex];
  constexpr int kBlockN = kTile.cols, kCluster = kTile.cluster;
  using C = KernelTraits<kTile.rows, kTile.cols, kTile.cluster, kTile.loop>;
  constexpr int kSub = C::kSub;
  const int grid = plan.grid;
  constexpr auto kernel = gemm_kernel<kTile.rows, kTile.cols, kTile.cluster, kTile.loop>;
  kDevices.allow_shared_memory<kernel>(dev, C::kSmemBytes);
  const auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  // Clustered tiles load half of the shared operand each (A along N, B along M) and multicast it.
  constexpr int kRowsA = C::kAlongN ? C::kBlockM / kCluster : C::kBlockM;
  constexpr int kRowsB = C::kAlongN ? kBlockN : kBlockN / kCluster;
  // A tile taller than M (then the only M block) loads just the M real rows of A and their scales
  // (rounded up to a 16-byte box): TMA fills rows past the end far slower than it loads real ones.
  // The rest of the stage keeps stale bytes, which reach only accumulator rows past M, never stored.
  // Multicast halves keep whole boxes.
  const bool short_a = !C::kAlongN && a.m < C::kBlockM;
  const int rows_a = short_a ? static_cast<int>(a.m) : kRowsA;
  const int scales_a = short_a ? round_up_to_4_rows(rows_a) : C::kBlockM;
  const CUtensorMap map_a = make_map(reinterpret_cast<void*>(a.a), u8, 1, a.k, a.m, a.lda, kBlockK, rows_a, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap map_b = make_map(reinterpret_cast<void*>(a.b), u8, 1, a.k, a.n, a.ldb, kBlockK, kRowsB,
                                     CU_TENSOR_MAP_SWIZZLE_128B);
  // A scales, MN-major: row kb holds the scales of every M row for that K block.
  const CUtensorMap map_s = make_map(reinterpret_cast<void*>(a.a_scale), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, a.m,
                                     a.k / kBlockK, a.a_scale_ld, scales_a, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  // Every CTA's stage receives all of A (multicast: both halves), B and the scales; TMA counts
  // bytes it fills past the end of a box too.
  p.tx_bytes = (short_a ? rows_a * kBlockK : C::kABytes) + C::kBBytes + scales_a * 4;
  p.order = make_tile_order(m_groups_of<kCluster, C::kAlongN>(p), n_groups_of<kCluster, C::kAlongN>(p), plan.group_m);
  // 2-CTA clusters: multicast pairs (kCluster = 2) or the plan's placement pairs of 1-CTA tiles.
  // Persistent: no more clusters than can be resident at once (asked once per device). A GPU without
  // room for 2-CTA clusters runs placement pairs unpaired. Unpaired launches keep the attribute at 1, which
  // is not a plain launch: it places neighbouring CTAs on different TPCs (plain: CTAs 2i and 2i + 1 on one).
  // The unpaired decode plans were tuned this way; a plain launch measured mixed there.
  LaunchConfig launch(grid, C::kThreads, C::kSmemBytes, stream);
  cudaLaunchConfig_t& config = launch.config;
  cudaLaunchAttribute& cluster = launch.attrs[0];
  if (kCluster > 1 || plan.placement_pairs) {
    cluster.val.clusterDim.x = 2;
    const int resident = resident_pairs<kernel>(config, dev);
    if (!resident && kCluster > 1) kDevices.fail("no 2-CTA cluster fits on this GPU");
    if (resident) config.gridDim = dim3(std::min(grid / 2, resident) * 2);  // the plan's grid is even
    else cluster.val.clusterDim.x = 1, config.gridDim = dim3(grid);
  }
  // bf16 output: TMA stores of 64-column boxes over a consumer warpgroup's rows, 128-byte swizzled
  // (32-wide tiles: 64 x 32 boxes, 64-byte swizzled). Unused for fp32 out, split-K and 16-wide
  // tiles, but a map over the real output is always valid to encode.
  const CUtensorMap map_out = make_map(reinterpret_cast<void*>(a.out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.n, a.m,
                                       a.out_kind == fp8gemm::kOutFP32 ? 2 * a.ldo : a.ldo,
                                       C::kWideStore ? 64 : 32, C::kWideStore ? 64 * kSub : 64,
                                       C::kWideStore ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
  kDevices.check(cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_s, map_out, map_s, p), "GEMM kernel launch");
}

// The launch of tile kTiles[kIndex] where this translation unit compiles it (its Unit), else null.
template <Unit kUnit, int kIndex>
constexpr TileLaunch launch_in_unit() {
  if constexpr (kTiles[kIndex].unit == kUnit) return &launch_tile<kIndex>;
  else return nullptr;
}

template <Unit kUnit, int... kIndex>
TileLaunch unit_launch(int index, std::integer_sequence<int, kIndex...>) {
  static constexpr TileLaunch kLaunches[] = {launch_in_unit<kUnit, kIndex>()...};
  return index >= 0 && index < kTileCount ? kLaunches[index] : nullptr;
}

}  // namespace

}  // namespace fp8gemm_sm90a
