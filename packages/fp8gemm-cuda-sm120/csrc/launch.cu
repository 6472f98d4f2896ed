// Host side: picks the plan (heuristics.hpp), launches the kernel(s) on the caller's stream.
#include <cuda_runtime.h>

#include "fp8gemm/cuda/device.hpp"
#include "fp8gemm/cuda/reduce_splits.cuh"
#include "gemm_kernel.cuh"
#include "launch.hpp"

namespace fp8gemm_sm120 {
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm120");

template <int WARPS_M, int STAGES>
void launch_tiles(const Params& p, int m, int n, int splits, cudaStream_t stream, int dev) {
  using T = Traits<WARPS_M, STAGES>;
  kDevices.allow_shared_memory<gemm_kernel<WARPS_M, STAGES>>(dev, T::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kBlockN)), static_cast<unsigned>(ceil_div(m, T::kBlockM)), splits);
  gemm_kernel<WARPS_M, STAGES><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
}

}  // namespace

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return workspace_bytes(m, n, k, kDevices.sm_count(kDevices.current()));
}

void launch(const fp8gemm::LaunchArgs& args) {
  const int dev = kDevices.current();
  const Plan plan = plan_for(args.m, args.n, args.k, kDevices.sm_count(dev));
  const int splits = plan.split.splits;
  if (splits > 1 && !args.workspace) kDevices.fail("split-K plan needs the workspace");
  const Params p = fp8gemm::gemm_params(args, splits, plan.split.kb_per_split);
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (plan.config == TileConfig::M64)
    launch_tiles<1, 4>(p, p.m, p.n, splits, stream, dev);
  else
    launch_tiles<2, 3>(p, p.m, p.n, splits, stream, dev);
  kDevices.check(cudaGetLastError(), "GEMM kernel launch");
  if (splits > 1) {
    fp8gemm::cuda::enqueue_reduce_splits(p.partial, p.out, p.m, p.n, p.ldo, splits, p.out_fp32, 8 * kDevices.sm_count(dev),
                                   stream);
    kDevices.check(cudaGetLastError(), "split-K reduction launch");
  }
}

}  // namespace fp8gemm_sm120
