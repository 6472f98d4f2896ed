// The mixture-of-experts step kernels: the core's CUDA launchers (fp8gemm/cuda/moe.cuh), built for this arch.
#include "fp8gemm/cuda/moe.cuh"
#include "launch.hpp"

namespace {
constexpr const char* kPackage = "fp8gemm-cuda-sm120";
}  // namespace

void fp8gemm_sm120::moe_route(const fp8gemm::MoeRouteArgs& args) { fp8gemm::cuda::launch_moe_route(args, kPackage); }

void fp8gemm_sm120::moe_activation(const fp8gemm::MoeActivationArgs& args) {
  fp8gemm::cuda::launch_moe_activation(args, kPackage);
}

void fp8gemm_sm120::moe_combine(const fp8gemm::MoeCombineArgs& args) { fp8gemm::cuda::launch_moe_combine(args, kPackage); }

int64_t fp8gemm_sm120::moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return fp8gemm::moe_workspace_bytes(tokens, top_k, experts);
}
