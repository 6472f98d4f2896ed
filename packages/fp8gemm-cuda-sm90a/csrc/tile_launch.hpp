// The launches of the compiled tiles (tile_config.hpp kTiles), by index, from the translation unit that
// compiles each one: tiles.cu (Unit::kDefault) and tiles_register_level10.cu (Unit::kRegisterLevel10).
#pragma once
#include <cuda_runtime.h>

#include "fp8gemm/backend.hpp"
#include "heuristics.hpp"
#include "kernel_traits.cuh"

namespace fp8gemm_sm90a {

using TileLaunch = void (*)(const fp8gemm::LaunchArgs& args, Params p, const Plan& plan, cudaStream_t stream, int dev);

// The launch of kTiles[index] if its unit is the named one, else null.
TileLaunch default_unit_launch(int index);
TileLaunch register_level10_unit_launch(int index);

}  // namespace fp8gemm_sm90a
