// The entry points every arch package defines, declared once. The package's own header names its namespace,
// then includes this one:
//   #define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm100
//   #include "fp8gemm/arch_entry.hpp"
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

#ifndef FP8GEMM_ARCH_NAMESPACE
#error "define FP8GEMM_ARCH_NAMESPACE (the arch package's namespace, e.g. fp8gemm_sm90a) before including fp8gemm/arch_entry.hpp"
#endif

namespace FP8GEMM_ARCH_NAMESPACE {

// One GEMM on args.stream; throws std::runtime_error on a launch error.
void launch(const fp8gemm::LaunchArgs& args);
// Device bytes launch() needs for (m, n, k) in args.workspace (split-K partials), 0 if none.
int64_t workspace_bytes(int64_t m, int64_t n, int64_t k);
// One activation quantization on args.stream (fp8gemm::QuantizeArgs).
void quantize(const fp8gemm::QuantizeArgs& args);
// One grouped GEMM on args.stream, contiguous or masked, after fp8gemm/grouped_launch.hpp's checks (no workspace).
void grouped_launch(const fp8gemm::GroupedArgs& args);
// The step kernels of fused_experts' pipeline on args.stream (fp8gemm/backend.hpp's Moe*Args, fp8gemm/moe_steps.cuh),
// and the device bytes the route step needs in args.workspace for (tokens, top_k, experts).
void moe_route(const fp8gemm::MoeRouteArgs& args);
void moe_activation(const fp8gemm::MoeActivationArgs& args);
void moe_combine(const fp8gemm::MoeCombineArgs& args);
int64_t moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts);

}  // namespace FP8GEMM_ARCH_NAMESPACE
