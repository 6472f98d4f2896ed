// Python binding: no libtorch, only integers in (see fp8gemm.protocol.LaunchFn).
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <string>

#include "launch.hpp"

namespace py = pybind11;

namespace {

py::dict build_info() {
  py::dict info;
  info["compiler"] = FP8GEMM_CUDA_COMPILER;
  info["cuda_runtime"] = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info["arch_flags"] = FP8GEMM_ARCH_FLAGS;
  info["targets"] = FP8GEMM_TARGETS;
  info["kernel"] = "wgmma m64n128k32 e4m3, TMA + mbarrier pipeline, warp-specialised, persistent, split-K for small M";
  return info;
}

void launch(uintptr_t a, uintptr_t b, uintptr_t a_scale, uintptr_t b_scale, uintptr_t out, uintptr_t workspace,
            int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldo, int64_t a_scale_ld,
            int64_t b_scale_ld, int out_kind, uintptr_t stream) {
  fp8gemm_sm90a::launch({a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld,
                         out_kind, stream});
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fp8gemm sm_90a kernels (wgmma + TMA FP8); see fp8gemm.protocol for the launch contract";
  m.def("launch", &launch, "Enqueue one GEMM on `stream` (all arguments are integers)");
  m.def("workspace_bytes", &fp8gemm_sm90a::workspace_bytes, "Scratch bytes launch() needs for this shape");
  m.def("build_info", &build_info);
}
