// This package's entry points, on the protocol's LaunchArgs (fp8gemm/backend.hpp from fp8gemm-core).
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

namespace fp8gemm_sm90a {

void launch(const fp8gemm::LaunchArgs& args);
int64_t workspace_bytes(int64_t m, int64_t n, int64_t k);
void quantize(const fp8gemm::QuantizeArgs& args);

}  // namespace fp8gemm_sm90a
