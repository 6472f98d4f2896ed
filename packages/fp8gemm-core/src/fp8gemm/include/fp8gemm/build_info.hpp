// build_info()'s common keys, from the macros fp8gemm_arch_module() defines (cmake/fp8gemm_arch_module.cmake):
// compiler, arch flags, targets, and for CUDA builds the runtime version; an arch adds its own keys.
#pragma once
#include <pybind11/pybind11.h>

#include <string>

namespace fp8gemm {
// Internal linkage: the macros differ per arch, and one library may link several arch packages' modules.
namespace {

inline pybind11::dict build_info(const char* kernel) {
  pybind11::dict info;
  info["compiler"] = FP8GEMM_COMPILER;
#if defined(CUDART_VERSION)
  info["cuda_runtime"] = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#endif
  info["arch_flags"] = FP8GEMM_ARCH_FLAGS;
  info["targets"] = FP8GEMM_TARGETS;
  info["kernel"] = kernel;
  return info;
}

}  // namespace
}  // namespace fp8gemm
