// The quantizing kernels (A quantized on chip, tile_config.hpp has_quantizing_kernel) of Unit::kDefault tiles.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

TileLaunch default_unit_quantizing_launch(int index) {
  return unit_launch<Unit::kDefault, true>(index, std::make_integer_sequence<int, kTileCount>());
}

}  // namespace fp8gemm_sm90a
