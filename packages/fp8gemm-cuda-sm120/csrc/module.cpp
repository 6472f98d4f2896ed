// Python binding: the protocol's module (fp8gemm/backend_module.hpp), no libtorch.
#include <cuda_runtime_api.h>

#include "fp8gemm/backend_module.hpp"
#include "fp8gemm/build_info.hpp"
#include "launch.hpp"

namespace {

pybind11::dict build_info() {
  return fp8gemm::build_info("mma.sync m16n8k32 e4m3, ldmatrix, cp.async pipeline, split-K for small M; grouped (contiguous, masked) in "
                             "one launch");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_backend_module(m, &fp8gemm_sm120::launch, &fp8gemm_sm120::workspace_bytes, &build_info);
  fp8gemm::define_quantize_entry(m, &fp8gemm_sm120::quantize);
  // A scales: MN-major with 16-byte columns (its backend.py's a_scale_layout).
  fp8gemm::define_two_step_linear_entry(m, &fp8gemm_sm120::quantize, &fp8gemm_sm120::launch, &fp8gemm_sm120::workspace_bytes, 4);
  fp8gemm::define_grouped_entry(m, &fp8gemm_sm120::grouped_launch, &fp8gemm_sm120::grouped_workspace_bytes);
  fp8gemm::define_moe_entry(m, &fp8gemm_sm120::moe_route, &fp8gemm_sm120::moe_activation, &fp8gemm_sm120::moe_combine,  // fused_experts' steps
                            &fp8gemm_sm120::moe_workspace_bytes);
}
