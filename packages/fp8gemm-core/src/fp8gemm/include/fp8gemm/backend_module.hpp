// The Python module every arch package exposes to the core (pybind11, no libtorch):
//   launch(16 ints), workspace_bytes(m, n, k), build_info() -> dict, and optionally quantize(10 ints) and
//   linear(16 ints) with linear_workspace_bytes(m, n, k, in_kind)
// An arch package's binding is then one line per entry:
//   PYBIND11_MODULE(_C, m) { fp8gemm::define_backend_module(m, &my::launch, &my::workspace_bytes, my::build_info); }
#pragma once
#include <pybind11/pybind11.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/linear_steps.hpp"

namespace fp8gemm {

template <class Launch, class WorkspaceBytes, class BuildInfo>
void define_backend_module(pybind11::module_& m, Launch launch, WorkspaceBytes workspace_bytes, BuildInfo build_info) {
  m.doc() = "fp8gemm backend kernels; see fp8gemm.protocol for the launch contract";
  m.def(
      "launch",
      [launch](uintptr_t a, uintptr_t b, uintptr_t a_scale, uintptr_t b_scale, uintptr_t out, uintptr_t workspace,
               int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldo, int64_t a_scale_ld,
               int64_t b_scale_ld, int out_kind, uintptr_t stream) {
        launch(LaunchArgs{a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld,
                          out_kind, stream});
      },
      "Enqueue one GEMM on `stream` (all arguments are integers)");
  m.def("workspace_bytes", workspace_bytes, "Scratch bytes launch() needs for this shape on the current device");
  m.def("build_info", build_info, "Compiler, toolkit, arch flags and kernel of this build");
}

// The optional activation-quantization entry (fp8gemm.protocol.QuantizeFn).
template <class Quantize>
void define_quantize_entry(pybind11::module_& m, Quantize quantize) {
  m.def(
      "quantize",
      [quantize](uintptr_t x, uintptr_t q, uintptr_t scale, int64_t m, int64_t k, int64_t ldx, int64_t scale_ld,
                 int in_kind, int pow2, uintptr_t stream) {
        quantize(QuantizeArgs{x, q, scale, m, k, ldx, scale_ld, in_kind, pow2, stream});
      },
      "Enqueue one activation quantization on `stream` (all arguments are integers)");
}

// The optional Linear-layer entry (fp8gemm.protocol.LinearFn): quantization and GEMM in one call.
template <class Linear, class WorkspaceBytes>
void define_linear_entry(pybind11::module_& m, Linear linear, WorkspaceBytes workspace_bytes) {
  m.def(
      "linear",
      [linear](uintptr_t x, uintptr_t b, uintptr_t b_scale, uintptr_t out, uintptr_t workspace, int64_t m, int64_t n,
               int64_t k, int64_t ldx, int64_t ldb, int64_t ldo, int64_t b_scale_ld, int out_kind, int in_kind, int pow2,
               uintptr_t stream) {
        linear(LinearArgs{x, b, b_scale, out, workspace, m, n, k, ldx, ldb, ldo, b_scale_ld, out_kind, in_kind, pow2, stream});
      },
      "Enqueue one Linear layer (activation quantization + GEMM) on `stream` (all arguments are integers)");
  m.def("linear_workspace_bytes", workspace_bytes, "Scratch bytes linear() needs for (m, n, k, in_kind) on the current device");
}

// The Linear-layer entry of an arch whose layer is its quantize, then its launch (fp8gemm/linear_steps.hpp): one
// call from Python, two launches. scale_ld_multiple: the leading-dimension multiple of its MN-major A scales.
template <class Quantize, class Launch, class WorkspaceBytes>
void define_two_step_linear_entry(pybind11::module_& m, Quantize quantize, Launch launch, WorkspaceBytes workspace_bytes,
                                  int scale_ld_multiple) {
  auto layout = [=](int64_t rows, int64_t n, int64_t k) {
    return linear_workspace(rows, k, workspace_bytes(rows, n, k), scale_ld_multiple);
  };
  define_linear_entry(
      m, [=](const LinearArgs& a) { linear_in_two_steps(a, layout(a.m, a.n, a.k), quantize, launch); },
      [=](int64_t rows, int64_t n, int64_t k, int) { return layout(rows, n, k).bytes; });
}

}  // namespace fp8gemm
