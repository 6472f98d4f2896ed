// Python binding: no libtorch, only integers in (see fp8gemm.protocol.LaunchFn).
#include "fp8gemm/backend_module.hpp"
#include "fp8gemm/build_info.hpp"
#include "launch.hpp"

namespace py = pybind11;
using namespace fp8gemm_gfx942;

namespace {

py::dict build_info() { return fp8gemm::build_info(
      "MFMA 32x32x16 fp8 (e4m3fnuz), LDS double buffering, split-K for small M; grouped (contiguous, masked) in one "
      "launch"); }

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

// The grouped launch geometry, for tests of its row-tile bound without a GPU.
py::dict grouped_plan(bool masked, int64_t m, int64_t n, int64_t groups, int64_t expected_m) {
  const GroupedGeometry g = grouped_geometry(masked, m, n, groups, expected_m);
  py::dict d;
  d["block_m"] = g.block_m;
  d["grid"] = py::make_tuple(g.grid_x, g.grid_y);
  d["tiles_per_group"] = g.tiles_per_group;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_backend_module(m, &launch, &workspace_bytes, &build_info);
  fp8gemm::define_quantize_entry(m, &quantize);
  // A scales: MN-major with 16-byte columns (its backend.py's a_scale_layout).
  fp8gemm::define_two_step_linear_entry(m, &quantize, &launch, &workspace_bytes, 4);
  fp8gemm::define_grouped_entry(m, &grouped_launch, &grouped_workspace_bytes);
  fp8gemm::define_moe_entry(m, &moe_route, &moe_activation, &moe_combine, &moe_workspace_bytes);  // fused_experts' steps
  m.def("grouped_plan", &grouped_plan, "Grouped launch geometry for (masked, m, n, groups, expected_m)");
  m.def("plan", &plan, "Launch geometry for (m, n, k) on a GPU with `cus` compute units");
}
