// This package's entry points (declared in the core: fp8gemm/arch_entry.hpp; launch.cpp defines them, module.cpp
// binds them through fp8gemm/arch_module.hpp) and its kernels' enqueue functions.
#pragma once
#include <cstdint>

#define FP8GEMM_ARCH_NAMESPACE fp8gemm_gfx942
#include "fp8gemm/arch_entry.hpp"
#include "fp8gemm/training_entries.hpp"
#include "fp8gemm/gemm_params.hpp"
#include "fp8gemm/grouped_params.hpp"
#include "fp8gemm/moe_steps.cuh"
#include "fp8gemm/quantize_grouped_tiles.cuh"
#include "fp8gemm/quantize_rows.cuh"
#include "fp8gemm/quantize_tiles.cuh"
#include "heuristics.hpp"

namespace fp8gemm_gfx942 {

// A scales: MN-major (a tile's row scales contiguous per K block), columns padded to 16 bytes; the module states it
// (a_scale_ld_multiple()) and backend.py reads it from there.
constexpr int kAScaleLdMultiple = 4;
// The weight-gradient entry's per-row B scales: MN-major too (a tile's column scales contiguous per K block).
constexpr int kWgradBScaleLdMultiple = 4;

using Params = fp8gemm::GemmParams;  // A and B FP8 e4m3fnuz

using GroupedParams = fp8gemm::GroupedParams;

// What the k-grouped weight-gradient kernel reads besides Params (fp8gemm/backend.hpp KGroupedWgradArgs): the token
// ends, read only on the device, and where out[e] starts.
struct KGroupedParams {
  const int32_t* offs;  // [experts] cumulative token ends, clamped on the device (fp8gemm/kgrouped_wgrad.hpp)
  int experts;
  int64_t out_es;  // elements from out[e] to out[e + 1]
};

int cu_count();

// Defined in kernels.hip: enqueue the GEMM tiles / the split-K reduction; return a hipError_t.
int enqueue_gemm(const Params& p, const Geometry& g, void* stream);
int enqueue_reduce(const Params& p, int splits, int blocks, void* stream);
// The weight-gradient GEMM (p.b_scale per row of b, MN-major; fp32 out, added into with `accumulate`).
int enqueue_wgrad(const Params& p, const Geometry& g, int accumulate, void* stream);
// The k-grouped weight-gradient GEMM: the wgrad tiles of g for each of kg.experts experts (grid z).
int enqueue_kgrouped_wgrad(const Params& p, const KGroupedParams& kg, const Geometry& g, int accumulate, void* stream);
// Defined in grouped.hip: enqueue one grouped GEMM; return a hipError_t.
int enqueue_grouped(const GroupedParams& p, const GroupedGeometry& g, void* stream);
// Defined in quantize.hip: enqueue one activation quantization (in_kind: fp8gemm::InKind).
int enqueue_quantize(const fp8gemm::QuantizeParams& p, int in_kind, void* stream);
// One quantization with a transpose on a grid of row_blocks x k_blocks workgroups (one 128 x 128 tile each).
int enqueue_quantize_transposed(const fp8gemm::QuantizeTransposedParams& p, int in_kind, int64_t row_blocks,
                                int64_t k_blocks, void* stream);
// The grouped quantization with a transpose on tiles x k_blocks workgroups (column-block indices, K blocks).
int enqueue_quantize_grouped_transposed(const fp8gemm::QuantizeGroupedParams& p, int in_kind, int64_t tiles,
                                        int64_t k_blocks, void* stream);
// The same grid, the rows computed by p.source (fp8gemm/quantize_sources.cuh); kNoSourceKernel, nothing enqueued, for
// a source and kinds it has no kernel for.
constexpr int kNoSourceKernel = -1;
int enqueue_quantize_grouped_source(const fp8gemm::QuantizeGroupedParams& p, int source, int in_kind, int gate_up_kind,
                                    int64_t tiles, int64_t k_blocks, void* stream);
// Defined in moe.hip: enqueue one mixture-of-experts step on the grid fp8gemm/moe_launch.hpp gives.
int enqueue_moe_route(const fp8gemm::MoeRouteParams& p, int64_t count_blocks, int64_t blocks, void* stream);
int enqueue_moe_activation(const fp8gemm::MoeActivationParams& p, int64_t k_blocks, int64_t row_groups, void* stream);
int enqueue_moe_combine(const fp8gemm::MoeCombineParams& p, int64_t blocks, void* stream);

}  // namespace fp8gemm_gfx942
