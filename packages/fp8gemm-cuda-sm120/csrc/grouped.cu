// Host side of the grouped GEMM: checks the sizes (fp8gemm/grouped_launch.hpp), picks the tile
// (heuristics.hpp grouped_plan_for) and launches grouped_kernel once on the caller's stream.
#include <cuda_runtime.h>

#include "fp8gemm/cuda/device.hpp"
#include "fp8gemm/grouped_launch.hpp"
#include "grouped_kernel.cuh"
#include "launch.hpp"

namespace fp8gemm_sm120 {
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm120");

template <int WARPS_M, int STAGES>
void launch_grouped_tiles(const GroupedParams& p, const GroupedPlan& plan, cudaStream_t stream, int dev) {
  using T = Traits<WARPS_M, STAGES>;
  kDevices.allow_shared_memory<grouped_kernel<WARPS_M, STAGES>>(dev, T::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  grouped_kernel<WARPS_M, STAGES><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
}

}  // namespace

void grouped_launch(const fp8gemm::GroupedArgs& args) {
  if (!fp8gemm::grouped_launch_has_work(args, kDevices.package(), /*row_ids=*/true)) return;
  GroupedPlan plan = grouped_plan_for(args.layout, args.m, args.n, args.groups, args.expected_m);
  fp8gemm::check_grouped_tiles(plan.row_tiles, plan.grid_x, 0, kDevices.package());  // before any device query
  const int dev = kDevices.current();
  if (args.layout == fp8gemm::kGroupedRowIds)  // row ids: a grid of two blocks per SM
    plan = grouped_plan_for(args.layout, args.m, args.n, args.groups, args.expected_m, kDevices.sm_count(dev));
  const GroupedParams p = fp8gemm::grouped_params(args, plan.tiles_per_group, plan.row_tiles);
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (plan.config == TileConfig::M64)
    launch_grouped_tiles<1, 4>(p, plan, stream, dev);
  else
    launch_grouped_tiles<2, 3>(p, plan, stream, dev);
  kDevices.check(cudaGetLastError(), "grouped GEMM kernel launch");
}

}  // namespace fp8gemm_sm120
