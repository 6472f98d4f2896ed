// Python binding: the protocol's module (fp8gemm/backend_module.hpp), no libtorch.
#include <cuda_runtime_api.h>

#include <string>

#include "fp8gemm/backend_module.hpp"
#include "launch.hpp"

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["compiler"] = FP8GEMM_CUDA_COMPILER;
  info["cuda_runtime"] = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info["arch_flags"] = FP8GEMM_ARCH_FLAGS;
  info["targets"] = FP8GEMM_TARGETS;
  info["kernel"] = "mma.sync m16n8k32 e4m3, ldmatrix, cp.async pipeline, split-K for small M";
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_backend_module(m, &fp8gemm_sm120::launch, &fp8gemm_sm120::workspace_bytes, &build_info);
  fp8gemm::define_quantize_entry(m, &fp8gemm_sm120::quantize);
}
