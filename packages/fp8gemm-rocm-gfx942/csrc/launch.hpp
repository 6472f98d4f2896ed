// This package's entry points, on the protocol's LaunchArgs (fp8gemm/backend.hpp), and the kernels'.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/gemm_params.hpp"
#include "fp8gemm/quantize_rows.cuh"
#include "heuristics.hpp"

namespace fp8gemm_gfx942 {

using Params = fp8gemm::GemmParams;  // A and B FP8 e4m3fnuz

void launch(const fp8gemm::LaunchArgs& args);
int64_t workspace_bytes(int64_t m, int64_t n, int64_t k);
void quantize(const fp8gemm::QuantizeArgs& args);
int cu_count();

// Defined in kernels.hip: enqueue the GEMM tiles / the split-K reduction; return a hipError_t.
int enqueue_gemm(const Params& p, const Geometry& g, void* stream);
int enqueue_reduce(const Params& p, int splits, int blocks, void* stream);
// Defined in quantize.hip: enqueue one activation quantization (in_kind: fp8gemm::InKind).
int enqueue_quantize(const fp8gemm::QuantizeParams& p, int in_kind, void* stream);

}  // namespace fp8gemm_gfx942
