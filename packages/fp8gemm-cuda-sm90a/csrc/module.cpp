// Python binding: the protocol's module (fp8gemm/arch_module.hpp), no libtorch.
#include "launch.hpp"  // first: it names the namespace fp8gemm/arch_module.hpp binds

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "fp8gemm/arch_module.hpp"
#include "fp8gemm/build_info.hpp"
#include "tile_config.hpp"

namespace {

// The tile shapes this build compiles ("rows,cols[,cluster]"), each once, in kTiles' order: shown by
// `fp8gemm info` beside the build.
std::string compiled_tiles() {
  std::string tiles;
  for (int i = 0; i < fp8gemm_sm90a::kTileCount; ++i) {
    const fp8gemm_sm90a::TileConfig& t = fp8gemm_sm90a::kTiles[i];
    bool seen = false;
    for (int j = 0; j < i; ++j)
      seen |= fp8gemm_sm90a::kTiles[j].rows == t.rows && fp8gemm_sm90a::kTiles[j].cols == t.cols &&
              fp8gemm_sm90a::kTiles[j].cluster == t.cluster;
    if (!seen)
      tiles += (tiles.empty() ? "" : " ") + std::to_string(t.rows) + "," + std::to_string(t.cols) +
               (t.cluster > 1 ? "," + std::to_string(t.cluster) : "");
  }
  return tiles;
}

pybind11::dict build_info() {
  pybind11::dict info = fp8gemm::build_info(
      "wgmma m64nNk32 e4m3 (N 16..192, multiples of 16), TMA + mbarrier pipeline, warp-specialised, persistent, "
      "tile chosen by a wave model, split-K for small M; grouped (contiguous, masked, row ids) in one persistent "
      "launch; weight gradient (1x128 B scales per column, fp32 out added into) on the one-set kernels");
  info["tiles"] = compiled_tiles();
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_arch_module(m, &build_info);
  // The optional training entries (fp8gemm/training_entries.hpp): wgrad_launch.cuh, quantize.cu.
  fp8gemm::define_wgrad_entry(m, &fp8gemm_sm90a::wgrad_launch, &fp8gemm_sm90a::wgrad_workspace_bytes,
                              fp8gemm_sm90a::kWgradBScaleLdMultiple);
  fp8gemm::define_quantize_transposed_entry(m, &fp8gemm_sm90a::quantize_transposed);
  fp8gemm::define_quantize_grouped_transposed_entry(m, &fp8gemm_sm90a::quantize_grouped_transposed);
  fp8gemm::define_kgrouped_wgrad_entry(m, &fp8gemm_sm90a::kgrouped_wgrad_launch);
  static const fp8gemm::NativeTrainingEntries training{
      fp8gemm::kNativeTrainingEntriesVersion, sizeof(fp8gemm::NativeTrainingEntries), &fp8gemm_sm90a::quantize_transposed,
      &fp8gemm_sm90a::wgrad_launch, &fp8gemm_sm90a::wgrad_workspace_bytes, fp8gemm_sm90a::kWgradBScaleLdMultiple};
  fp8gemm::define_native_training_entries(m, &training);
  // Not part of the protocol: the tests run every compiled grouped kernel, not only those the plan picks.
  m.def("grouped_tiles", [] {
    pybind11::list tiles;
    for (const auto& t : fp8gemm_sm90a::kGroupedTiles) tiles.append(pybind11::make_tuple(t.rows, t.cols, t.cluster));
    return tiles;
  }, "(rows, cols, cluster) of each compiled grouped kernel, in kGroupedTiles' order");
  m.def("grouped_launch_tile", [](uintptr_t args, int tile_index) {
    if (tile_index < -1 || tile_index >= fp8gemm_sm90a::kGroupedTileCount)  // before the arguments are read
      throw std::invalid_argument("grouped tile index " + std::to_string(tile_index) + " is not one of the " +
                                  std::to_string(fp8gemm_sm90a::kGroupedTileCount) + " compiled (or -1: the plan's)");
    fp8gemm_sm90a::grouped_launch_tile(fp8gemm::read_wire<fp8gemm::GroupedArgs>(args, "grouped_launch"), tile_index);
  }, "grouped_launch on grouped_tiles()[tile_index] instead of the plan's tile (-1: the plan's)");
}
