// The kernels of Unit::kDefault tiles (tile_config.hpp), compiled with the package's ptxas options.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

TileLaunch default_unit_launch(int index) {
  return unit_launch<Unit::kDefault>(index, std::make_integer_sequence<int, kTileCount>());
}

}  // namespace fp8gemm_sm90a
