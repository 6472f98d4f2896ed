// This package's entry points, on the protocol's LaunchArgs (fp8gemm/backend.hpp), and the kernels'.
#pragma once
#include <cstdint>

#define FP8GEMM_ARCH_NAMESPACE fp8gemm_gfx942
#include "fp8gemm/arch_entry.hpp"  // launch, workspace_bytes, quantize
#include "fp8gemm/gemm_params.hpp"
#include "fp8gemm/grouped_params.hpp"
#include "fp8gemm/moe_steps.cuh"
#include "fp8gemm/quantize_rows.cuh"
#include "heuristics.hpp"

namespace fp8gemm_gfx942 {

using Params = fp8gemm::GemmParams;  // A and B FP8 e4m3fnuz

using GroupedParams = fp8gemm::GroupedParams;

int cu_count();

// The grouped entry (csrc/module.cpp binds it through define_grouped_entry): contiguous and masked layouts.
void grouped_launch(const fp8gemm::GroupedArgs& args);
int64_t grouped_workspace_bytes(int layout, int64_t m, int64_t n, int64_t k, int64_t groups);

// Defined in kernels.hip: enqueue the GEMM tiles / the split-K reduction; return a hipError_t.
int enqueue_gemm(const Params& p, const Geometry& g, void* stream);
int enqueue_reduce(const Params& p, int splits, int blocks, void* stream);
// Defined in grouped.hip: enqueue one grouped GEMM; return a hipError_t.
int enqueue_grouped(const GroupedParams& p, const GroupedGeometry& g, void* stream);
// Defined in quantize.hip: enqueue one activation quantization (in_kind: fp8gemm::InKind).
int enqueue_quantize(const fp8gemm::QuantizeParams& p, int in_kind, void* stream);
// Defined in moe.hip: enqueue one mixture-of-experts step on the grid fp8gemm/moe_launch.hpp gives.
int enqueue_moe_route(const fp8gemm::MoeRouteParams& p, int64_t count_blocks, int64_t blocks, void* stream);
int enqueue_moe_activation(const fp8gemm::MoeActivationParams& p, int64_t k_blocks, int64_t row_groups, void* stream);
int enqueue_moe_combine(const fp8gemm::MoeCombineParams& p, int64_t blocks, void* stream);

}  // namespace fp8gemm_gfx942
