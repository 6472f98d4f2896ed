// This package's entry points, on the protocol's LaunchArgs (fp8gemm/backend.hpp), and the kernels'.
#pragma once
#include <cstdint>

#define FP8GEMM_ARCH_NAMESPACE fp8gemm_gfx942
#include "fp8gemm/arch_entry.hpp"  // launch, workspace_bytes, quantize
#include "fp8gemm/gemm_params.hpp"
#include "fp8gemm/quantize_rows.cuh"
#include "heuristics.hpp"

namespace fp8gemm_gfx942 {

using Params = fp8gemm::GemmParams;  // A and B FP8 e4m3fnuz

int cu_count();

// Defined in kernels.hip: enqueue the GEMM tiles / the split-K reduction; return a hipError_t.
int enqueue_gemm(const Params& p, const Geometry& g, void* stream);
int enqueue_reduce(const Params& p, int splits, int blocks, void* stream);
// Defined in quantize.hip: enqueue one activation quantization (in_kind: fp8gemm::InKind).
int enqueue_quantize(const fp8gemm::QuantizeParams& p, int in_kind, void* stream);

}  // namespace fp8gemm_gfx942
