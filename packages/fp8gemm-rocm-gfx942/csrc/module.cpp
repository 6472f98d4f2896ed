// Python binding: no libtorch, only integers in (see fp8gemm.protocol.LaunchFn).
#include <pybind11/pybind11.h>

#include "launch.hpp"

namespace py = pybind11;
using namespace fp8gemm_gfx942;

namespace {

py::dict build_info() {
  py::dict info;
  info["compiler"] = FP8GEMM_HIP_COMPILER_ID;
  info["arch_flags"] = "--offload-arch=" FP8GEMM_OFFLOAD_ARCH;
  info["targets"] = "gfx942";
  info["kernel"] = "MFMA 32x32x16 fp8 (e4m3fnuz), LDS double buffering, split-K for small M";
  return info;
}

// The launch geometry launch() would use, for tests of the host-side tiling logic without a GPU.
py::dict plan(int64_t m, int64_t n, int64_t k, int cus) {
  const Geometry g = geometry(m, n, k, cus);
  py::dict d;
  d["block_m"] = g.block_m;
  d["block_n"] = kBlockN;
  d["grid"] = py::make_tuple(g.grid_x, g.grid_y, g.grid_z);
  d["kb_per_split"] = g.kb_per_split;
  d["workspace_bytes"] = g.workspace_bytes;
  return d;
}

void launch_ints(uintptr_t a, uintptr_t b, uintptr_t a_scale, uintptr_t b_scale, uintptr_t out, uintptr_t workspace,
                 int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldo, int64_t a_scale_ld,
                 int64_t b_scale_ld, int out_kind, uintptr_t stream) {
  launch({a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld, out_kind, stream});
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fp8gemm gfx942 kernels (MFMA FP8); see fp8gemm.protocol for the launch contract";
  m.def("launch", &launch_ints, "Enqueue one GEMM on `stream` (all arguments are integers)");
  m.def("workspace_bytes", &workspace_bytes, "Scratch bytes launch() needs for this shape on the current device");
  m.def("plan", &plan, "Launch geometry for (m, n, k) on a GPU with `cus` compute units");
  m.def("build_info", &build_info);
}
