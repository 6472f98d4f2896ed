// Host side of the grouped GEMM: checks the sizes (group_rows is the device's to clamp), picks the tile
// (heuristics.hpp grouped_plan_for) and launches grouped_kernel once on the caller's stream.
#include <cuda_runtime.h>

#include <climits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "fp8gemm/cuda/device.hpp"
#include "grouped_kernel.cuh"
#include "launch.hpp"

namespace fp8gemm_sm120 {
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm120");

template <int WARPS_M, int STAGES>
void launch_grouped_tiles(const GroupedParams& p, const GroupedPlan& plan, cudaStream_t stream, int dev) {
  using T = Traits<WARPS_M, STAGES>;
  static std::once_flag configured[fp8gemm::cuda::kMaxDevices];  // the >48 KB shared-memory opt-in is per device
  std::call_once(configured[dev], [] {
    kDevices.check(cudaFuncSetAttribute(grouped_kernel<WARPS_M, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        T::kSmemBytes),
                   "cudaFuncSetAttribute");
  });
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  grouped_kernel<WARPS_M, STAGES><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
}

}  // namespace

int64_t grouped_workspace_bytes(int, int64_t, int64_t, int64_t, int64_t) { return 0; }  // no split-K

void grouped_launch(const fp8gemm::GroupedArgs& args) {
  if (args.layout != fp8gemm::kGroupedContiguous && args.layout != fp8gemm::kGroupedMasked)
    throw std::invalid_argument("fp8gemm-cuda-sm120: grouped layout " + std::to_string(args.layout) +
                                " is not supported (contiguous and masked are)");
  // Row indices and tile counts are ints on the device: keep m plus a tile, and the row tiles, below 2^31.
  if (args.m < 0 || args.groups < 0 || args.m > INT_MAX - 256 || args.groups > INT_MAX || args.n > INT_MAX ||
      args.k > INT_MAX)
    throw std::invalid_argument("fp8gemm-cuda-sm120: grouped sizes must lie in [0, 2^31 - 256)");
  if (args.m == 0 || args.groups == 0) return;  // no rows: nothing to write
  const GroupedPlan plan = grouped_plan_for(args.layout == fp8gemm::kGroupedMasked, args.m, args.n, args.groups,
                                            args.expected_m);
  if (plan.row_tiles > INT_MAX || plan.grid_x > INT_MAX)
    throw std::invalid_argument("fp8gemm-cuda-sm120: grouped GEMM of more than 2^31 tiles");
  const int dev = kDevices.current();
  const GroupedParams p = fp8gemm::grouped_params(args, plan.tiles_per_group, plan.row_tiles);
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (plan.config == TileConfig::M64)
    launch_grouped_tiles<1, 4>(p, plan, stream, dev);
  else
    launch_grouped_tiles<2, 3>(p, plan, stream, dev);
  kDevices.check(cudaGetLastError(), "grouped GEMM kernel launch");
}

}  // namespace fp8gemm_sm120
