// fp8gemm's Torch binding for kernel-builder (huggingface/kernels): see torch_binding.cpp.
#pragma once
#include <string>
#include <vector>

namespace fp8gemm_hub {

// The arch modules compiled into this op library, in registration order (each one's PYBIND11_MODULE stand-in,
// hub_shim/pybind11/pybind11.h, adds itself).
std::vector<std::string>& compiled_arches();

}  // namespace fp8gemm_hub
