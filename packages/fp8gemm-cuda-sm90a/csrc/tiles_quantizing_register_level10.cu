// The quantizing kernels (A quantized on chip) of Unit::kRegisterLevel10 tiles, with that unit's ptxas options.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

TileLaunch register_level10_unit_quantizing_launch(int index) {
  return unit_launch<Unit::kRegisterLevel10, true>(index, std::make_integer_sequence<int, kTileCount>());
}

}  // namespace fp8gemm_sm90a
