// The optional weight-gradient entry (fp8gemm/backend.hpp WgradArgs), declared apart from fp8gemm/arch_entry.hpp so
// an arch without it still builds: an arch that has it includes this after naming its namespace (as for
// arch_entry.hpp), defines both functions and, after define_arch_module, binds them with
//   fp8gemm::define_wgrad_entry(m, &arch::wgrad_launch, &arch::wgrad_workspace_bytes, arch::kWgradBScaleLdMultiple);
// (fp8gemm/backend_module.hpp), kWgradBScaleLdMultiple being the leading-dimension multiple of the B scales it reads.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

#ifndef FP8GEMM_ARCH_NAMESPACE
#error "define FP8GEMM_ARCH_NAMESPACE (the arch package's namespace, e.g. fp8gemm_sm90a) before including fp8gemm/wgrad_entry.hpp"
#endif

namespace FP8GEMM_ARCH_NAMESPACE {

// One weight-gradient GEMM on args.stream (fp32 out, written or, with args.accumulate, added into); throws
// std::runtime_error on a launch error.
void wgrad_launch(const fp8gemm::WgradArgs& args);
// Device bytes wgrad_launch() needs for (m, n, k) in args.workspace, 0 if none.
int64_t wgrad_workspace_bytes(int64_t m, int64_t n, int64_t k);

}  // namespace FP8GEMM_ARCH_NAMESPACE
