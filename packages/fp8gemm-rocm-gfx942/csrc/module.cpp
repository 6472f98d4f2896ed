// Python binding: the protocol's module (fp8gemm/arch_module.hpp), no libtorch, only integers in.
#include "launch.hpp"  // first: it names the namespace fp8gemm/arch_module.hpp binds

#include "fp8gemm/arch_module.hpp"
#include "fp8gemm/build_info.hpp"

namespace py = pybind11;
using namespace fp8gemm_gfx942;

namespace {

py::dict build_info() { return fp8gemm::build_info(
      "MFMA 32x32x16 fp8 (e4m3fnuz), LDS double buffering, split-K for small M; grouped (contiguous, masked, row ids) in "
      "one launch; weight gradient (1x128 B scales per column, fp32 out added into), dense or per expert in one launch; "
      "quantization with a transpose (one read), dense or per expert"); }

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
py::dict grouped_plan(int layout, int64_t m, int64_t n, int64_t groups, int64_t expected_m) {
  const GroupedGeometry g = grouped_geometry(layout, m, n, groups, expected_m);
  py::dict d;
  d["block_m"] = g.block_m;
  d["grid"] = py::make_tuple(g.grid_x, g.grid_y);
  d["tiles_per_group"] = g.tiles_per_group;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_arch_module(m, &build_info);
  // The optional training entries (fp8gemm/training_entries.hpp): the weight gradient (kernels.hip wgrad_kernel), its
  // k-grouped form (kgrouped_wgrad_kernel) and the transposing quantizer (quantize.hip quantize_transposed_kernel).
  fp8gemm::define_wgrad_entry(m, &wgrad_launch, &wgrad_workspace_bytes, kWgradBScaleLdMultiple);
  fp8gemm::define_kgrouped_wgrad_entry(m, &kgrouped_wgrad_launch);
  fp8gemm::define_quantize_transposed_entry(m, &quantize_transposed);
  fp8gemm::define_quantize_grouped_transposed_entry(m, &quantize_grouped_transposed);  // quantize.hip, per expert
  static const fp8gemm::NativeTrainingEntries training{fp8gemm::kNativeTrainingEntriesVersion,
                                                       sizeof(fp8gemm::NativeTrainingEntries), &quantize_transposed,
                                                       &wgrad_launch, &wgrad_workspace_bytes, kWgradBScaleLdMultiple};
  fp8gemm::define_native_training_entries(m, &training);
  m.def("grouped_plan", &grouped_plan, "Grouped launch geometry for (layout, m, n, groups, expected_m)");
  m.def("plan", &plan, "Launch geometry for (m, n, k) on a GPU with `cus` compute units");
}
