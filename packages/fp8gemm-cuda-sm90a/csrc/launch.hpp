// This package's entry points: the protocol's launch, workspace_bytes and quantize, declared in the core.
#pragma once
#define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm90a
#include "fp8gemm/arch_entry.hpp"

namespace fp8gemm_sm90a {

// The optional Linear-layer entry (fp8gemm/backend_module.hpp define_linear_entry): one launch with A quantized
// on chip where the plan's tile has such a kernel, else the quantizer and the GEMM (fp8gemm/linear_steps.hpp).
void linear(const fp8gemm::LinearArgs& args);
int64_t linear_workspace_bytes(int64_t m, int64_t n, int64_t k, int in_kind);

}  // namespace fp8gemm_sm90a
