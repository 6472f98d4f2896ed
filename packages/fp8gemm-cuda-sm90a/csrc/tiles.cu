// The kernels of Unit::kDefault tiles (tile_config.hpp), compiled with the package's ptxas options.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

TileLaunch default_unit_launch(int index) {
  return unit_launch<Unit::kDefault>(index, std::make_integer_sequence<int, kTileCount>());
}

}  // namespace fp8gemm_sm90a

// The weight-gradient entry and its kernels (GemmType::kWgrad) are compiled here too, with this unit's options.
#include "wgrad_launch.cuh"
