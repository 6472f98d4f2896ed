// Host side of the weight-gradient GEMM and its k-grouped form (fp8gemm/training_entries.hpp): checks the sizes,
// picks the tile (heuristics.hpp wgrad_plan_for) and launches wgrad_kernel once on the caller's stream.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "fp8gemm/cuda/device.hpp"
#include "launch.hpp"
#include "wgrad_kernel.cuh"

namespace fp8gemm_sm120 {
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm120");

// The wgrad tiles' stages fill sm_120's 99 KB (the column scales are their last 512 bytes).
static_assert(Traits<2, 3, true>::kSmemBytes <= 99 * 1024 && Traits<1, 4, true>::kSmemBytes <= 99 * 1024);

[[noreturn]] void refuse(const char* entry, const std::string& what) {
  throw std::invalid_argument(std::string(kDevices.package()) + ": " + entry + ": " + what);
}

// The checks and the parameter block both entries share (fp8gemm::WgradArgs or fp8gemm::KGroupedWgradArgs: the same
// operand fields).
template <class Args>
WgradParams wgrad_params(const Args& args, const char* entry) {
  if (const char* why = fp8gemm::wgrad_args_refusal(args)) refuse(entry, why);
  if (wgrad_plan_for(args.m, args.n).grid_y > kMaxGridY) refuse(entry, "too many rows for one launch");
  WgradParams w{};
  Params& p = w.g;
  fp8gemm::set_operands(p, args);  // b_scale: per row of b, MN-major
  p.kb_per_split = p.k / kBlockK;
  w.accumulate = args.accumulate != 0;
  return w;
}

template <int WARPS_M, int STAGES, bool kGrouped>
void launch_wgrad_tiles(const WgradParams& w, const WgradPlan& plan, unsigned experts, cudaStream_t stream, int dev) {
  using T = Traits<WARPS_M, STAGES, true>;
  kDevices.allow_shared_memory<wgrad_kernel<WARPS_M, STAGES, kGrouped>>(dev, T::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y), experts);
  wgrad_kernel<WARPS_M, STAGES, kGrouped><<<grid, T::kThreads, T::kSmemBytes, stream>>>(w);
}

template <bool kGrouped>
void launch_wgrad(const WgradParams& w, unsigned experts, uintptr_t stream_handle, const char* what) {
  const int dev = kDevices.current();
  const WgradPlan plan = wgrad_plan_for(w.g.m, w.g.n);
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  if (plan.config == TileConfig::M64)
    launch_wgrad_tiles<1, 4, kGrouped>(w, plan, experts, stream, dev);
  else
    launch_wgrad_tiles<2, 3, kGrouped>(w, plan, experts, stream, dev);
  kDevices.check(cudaGetLastError(), what);
}

}  // namespace

int64_t wgrad_workspace_bytes(int64_t, int64_t, int64_t) { return 0; }  // never split along K

void wgrad_launch(const fp8gemm::WgradArgs& args) {
  launch_wgrad<false>(wgrad_params(args, "wgrad_launch"), 1, args.stream, "weight-gradient kernel launch");
}

void kgrouped_wgrad_launch(const fp8gemm::KGroupedWgradArgs& args) {
  if (args.experts < 1 || args.experts > fp8gemm::kKGroupedMaxExperts || args.k < kBlockK * (args.experts + 1))
    refuse("kgrouped_wgrad_launch", "1 <= experts <= " + std::to_string(fp8gemm::kKGroupedMaxExperts) +
                                        " and k >= 128 * (experts + 1) (the per-expert aligned layout) are required");
  WgradParams w = wgrad_params(args, "kgrouped_wgrad_launch");
  w.offs = reinterpret_cast<const int32_t*>(args.offs);
  w.experts = static_cast<int>(args.experts), w.out_es = args.out_es;
  launch_wgrad<true>(w, static_cast<unsigned>(args.experts), args.stream, "k-grouped weight-gradient kernel launch");
}

}  // namespace fp8gemm_sm120
