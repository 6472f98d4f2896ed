// This package's entry points, declared in the core (fp8gemm/arch_entry.hpp, training_entries.hpp): launch.cu, quantize.cu, grouped.cu
// (contiguous, masked and row-id layouts), wgrad.cu (the weight gradient, dense and k-grouped) and moe.cu define them;
// module.cpp binds them all (fp8gemm/arch_module.hpp, fp8gemm/backend_module.hpp).
#pragma once
#define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm120
#include "fp8gemm/arch_entry.hpp"
#include "fp8gemm/training_entries.hpp"  // the transposing quantizers (quantize.cu), the weight gradient (wgrad.cu)

namespace fp8gemm_sm120 {

// A scales: MN-major with 16-byte columns, as the kernel copies a tile's A scales with 16-byte cp.async; the module
// states it (a_scale_ld_multiple()) and backend.py reads it from there.
constexpr int kAScaleLdMultiple = 4;
// The weight-gradient entries' per-row B scales: MN-major too, a tile's 128 column scales copied 16 bytes at a time.
constexpr int kWgradBScaleLdMultiple = 4;

}  // namespace fp8gemm_sm120
