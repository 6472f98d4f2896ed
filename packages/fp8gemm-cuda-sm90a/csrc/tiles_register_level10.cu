// The kernels of Unit::kRegisterLevel10 tiles (tile_config.hpp: the 128 x 96 tile and the warpgroup K split
// ones), compiled with DeepGEMM's ptxas --register-usage-level=10 (CMakeLists.txt), which measured faster on
// these kernels and ~1% slower on the 256-row ones.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

TileLaunch register_level10_unit_launch(int index) {
  return unit_launch<Unit::kRegisterLevel10>(index, std::make_integer_sequence<int, kTileCount>());
}

}  // namespace fp8gemm_sm90a
