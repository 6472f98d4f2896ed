// The CUDA side of the mixture-of-experts steps (fp8gemm/moe_steps.cuh), shared by every CUDA arch package: an
// arch's moe.cu includes this and forwards its entries to launch_moe_route, launch_moe_activation, launch_moe_combine
// and moe_workspace_bytes.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "fp8gemm/cuda/e4m3_arch.cuh"
#include "fp8gemm/moe_launch.hpp"
#include "fp8gemm/moe_steps.cuh"

namespace fp8gemm::cuda {
// Internal linkage: one library may link several arch packages, each with its own copy of these kernels.
namespace {

struct MoeArch : E4m3Arch {
  static __device__ __forceinline__ void barrier() { __syncthreads(); }
};

__global__ void __launch_bounds__(kMoeThreads) moe_count_kernel(MoeRouteParams p) {
  __shared__ MoeRouteShared s;
  moe_count_chunk<MoeArch>(p, blockIdx.x, threadIdx.x, s);
}

__global__ void __launch_bounds__(kMoeThreads) moe_route_kernel(MoeRouteParams p) {
  __shared__ MoeRouteShared s;
  moe_route_chunk<MoeArch>(p, blockIdx.x, threadIdx.x, s);
}

// blockIdx.x: kMoeGroups (token, K block) items.
__global__ void __launch_bounds__(kMoeThreads) moe_scatter_kernel(MoeRouteParams p) {
  asm volatile("griddepcontrol.launch_dependents;");  // the gate/up GEMM launched next may start its prologue
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kMoeGroups + threadIdx.x / kQuantLanes;
  if (item < p.tokens * (p.hidden / kQuantBlock)) moe_scatter_group<MoeArch>(p, item, threadIdx.x % kQuantLanes);
}

// blockIdx.x: the K block of I; blockIdx.y: kMoeGroups rows (grid-strided past 65535 of them).
__global__ void __launch_bounds__(kMoeThreads) moe_activation_kernel(MoeActivationParams p) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int64_t rows = moe_active_rows(p);
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * kMoeGroups + threadIdx.x / kQuantLanes; row < rows;
       row += static_cast<int64_t>(gridDim.y) * kMoeGroups)
    moe_activation_group<MoeArch>(p, row, blockIdx.x, threadIdx.x % kQuantLanes);  // 16-lane groups stay whole
}

// blockIdx.x: a token and kMoeThreads * kCols of its columns.
template <int kCols>  // p.combine_cols; min 1 block: sm_120 spilled the 4-column body at its default register budget
__global__ void __launch_bounds__(kMoeThreads, 1) moe_combine_kernel(MoeCombineParams p) {
  const unsigned per_token = static_cast<unsigned>(p.combine_blocks);  // 32-bit division
  const int64_t token = blockIdx.x / per_token;
  const int64_t col = (static_cast<int64_t>(blockIdx.x % per_token) * kMoeThreads + threadIdx.x) * kCols;
  if (col < p.hidden) moe_combine_body<kCols>(p, token, col);
}

// The grid's x within one launch; false: nothing to launch (no tokens or rows).
inline bool moe_grid_fits(const MoeGrid& g, const char* package, const char* entry) {
  if (g.x == 0 || g.y == 0) return false;
  if (g.x > 0x7fffffff) throw std::invalid_argument(moe_who(package, entry) + "too many tokens for one launch");
  return true;
}

inline void check_moe_launch(const char* package, const char* entry) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(package) + ": " + entry + " kernel launch: " + cudaGetErrorString(err));
}

inline void launch_moe_route(const MoeRouteArgs& args, const char* package) {
  const MoeGrid g = moe_route_grid(args, package);
  if (!moe_grid_fits(g, package, "moe_route")) return;
  const MoeRouteParams p = moe_route_params(args);
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (g.count_blocks) moe_count_kernel<<<static_cast<unsigned>(g.count_blocks), kMoeThreads, 0, stream>>>(p);
  moe_route_kernel<<<static_cast<unsigned>(g.x), kMoeThreads, 0, stream>>>(p);
  moe_scatter_kernel<<<static_cast<unsigned>(moe_scatter_blocks(args.tokens, args.hidden)), kMoeThreads, 0, stream>>>(p);
  check_moe_launch(package, "moe_route");
}

inline void launch_moe_activation(const MoeActivationArgs& args, const char* package) {
  const MoeGrid g = moe_activation_grid(args, package);
  if (!moe_grid_fits(g, package, "moe_activation")) return;
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y < 65535 ? g.y : 65535));
  moe_activation_kernel<<<grid, kMoeThreads, 0, reinterpret_cast<cudaStream_t>(args.stream)>>>(moe_activation_params(args));
  check_moe_launch(package, "moe_activation");
}

inline void launch_moe_combine(const MoeCombineArgs& args, const char* package) {
  const MoeGrid g = moe_combine_grid(args, package);
  if (!moe_grid_fits(g, package, "moe_combine")) return;
  const MoeCombineParams p = moe_combine_params(args);
  const auto blocks = static_cast<unsigned>(g.x);
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (p.combine_cols == 4) moe_combine_kernel<4><<<blocks, kMoeThreads, 0, stream>>>(p);
  else moe_combine_kernel<8><<<blocks, kMoeThreads, 0, stream>>>(p);
  check_moe_launch(package, "moe_combine");
}

}  // namespace
}  // namespace fp8gemm::cuda
