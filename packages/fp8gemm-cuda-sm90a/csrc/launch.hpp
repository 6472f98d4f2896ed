// This package's entry points, declared in the core (fp8gemm/arch_entry.hpp): launch.cu, quantize.cu, grouped.cu
// (contiguous and masked layouts) and moe.cu define them; module.cpp binds them all (fp8gemm/arch_module.hpp). The
// optional weight-gradient entry (fp8gemm/training_entries.hpp): wgrad_launch.cuh, compiled in wgrad.cu.
#pragma once
#define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm90a
#include "fp8gemm/arch_entry.hpp"
#include "fp8gemm/training_entries.hpp"

namespace fp8gemm_sm90a {

// A scales: MN-major with 16-byte columns, as TMA loads one row of them per K block (16-byte strides); the module
// states it (a_scale_ld_multiple()) and backend.py reads it from there.
constexpr int kAScaleLdMultiple = 4;
// The weight-gradient GEMM's per-row B scales: MN-major too (TMA loads the tile's columns of one K block), 16-byte rows.
constexpr int kWgradBScaleLdMultiple = 4;

// grouped_launch on kGroupedTiles[tile_index] instead of the plan's tile (-1: the plan's), for the tests that run
// every compiled grouped kernel; tile_index in [-1, kGroupedTileCount), checked by module.cpp before the arguments.
void grouped_launch_tile(const fp8gemm::GroupedArgs& args, int tile_index);

}  // namespace fp8gemm_sm90a
