// The mixture-of-experts step kernels: the core's CUDA launcher (fp8gemm/cuda/moe.cuh), built for this arch.
#include "fp8gemm/cuda/moe.cuh"
#include "launch.hpp"

void fp8gemm_sm90a::moe_step(const fp8gemm::MoeArgs& args) { fp8gemm::cuda::launch_moe_step(args, "fp8gemm-cuda-sm90a"); }

int64_t fp8gemm_sm90a::moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return fp8gemm::moe_workspace_bytes(tokens, top_k, experts);
}
