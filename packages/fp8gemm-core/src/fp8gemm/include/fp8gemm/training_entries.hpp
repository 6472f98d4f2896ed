// The optional training entries, the weight-gradient GEMM (fp8gemm/backend.hpp WgradArgs) and the transposing
// quantizers (QuantizeTransposedArgs, QuantizeGroupedTransposedArgs), declared apart from fp8gemm/arch_entry.hpp so an
// arch without them still builds: an arch that has them includes
// this after naming its namespace (as for arch_entry.hpp), defines the functions and, after define_arch_module,
// binds them with (fp8gemm/backend_module.hpp)
//   fp8gemm::define_wgrad_entry(m, &arch::wgrad_launch, &arch::wgrad_workspace_bytes, arch::kWgradBScaleLdMultiple);
//   fp8gemm::define_quantize_transposed_entry(m, &arch::quantize_transposed);
//   fp8gemm::define_quantize_grouped_transposed_entry(m, &arch::quantize_grouped_transposed);
//   fp8gemm::define_kgrouped_wgrad_entry(m, &arch::kgrouped_wgrad_launch);
// kWgradBScaleLdMultiple being the leading-dimension multiple of the B scales its wgrad_launch reads.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

#ifndef FP8GEMM_ARCH_NAMESPACE
#error "define FP8GEMM_ARCH_NAMESPACE (the arch package's namespace, e.g. fp8gemm_sm90a) before including fp8gemm/training_entries.hpp"
#endif

namespace FP8GEMM_ARCH_NAMESPACE {

// One weight-gradient GEMM on args.stream (fp32 out, written or, with args.accumulate, added into); throws
// std::runtime_error on a launch error.
void wgrad_launch(const fp8gemm::WgradArgs& args);
// Device bytes wgrad_launch() needs for (m, n, k) in args.workspace, 0 if none.
int64_t wgrad_workspace_bytes(int64_t m, int64_t n, int64_t k);
// One quantization of an operand and its transpose on args.stream (bound with
// fp8gemm::define_quantize_transposed_entry(m, &arch::quantize_transposed)); throws std::runtime_error on a launch error.
void quantize_transposed(const fp8gemm::QuantizeTransposedArgs& args);
// One quantization of rows sorted by expert and of their per-expert transpose on args.stream (bound with
// fp8gemm::define_quantize_grouped_transposed_entry); throws std::runtime_error on a launch error.
void quantize_grouped_transposed(const fp8gemm::QuantizeGroupedTransposedArgs& args);
// Every expert's weight gradient over its own K blocks in one launch on args.stream (bound with
// fp8gemm::define_kgrouped_wgrad_entry); throws std::runtime_error on a launch error.
void kgrouped_wgrad_launch(const fp8gemm::KGroupedWgradArgs& args);

}  // namespace FP8GEMM_ARCH_NAMESPACE
