// This package's entry points: the protocol's launch, workspace_bytes and quantize, declared in the core, and the
// grouped entry (grouped.cu; module.cpp binds it through define_grouped_entry): contiguous and masked layouts.
#pragma once
#define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm90a
#include "fp8gemm/arch_entry.hpp"

namespace fp8gemm_sm90a {

void grouped_launch(const fp8gemm::GroupedArgs& args);
// grouped_launch on kGroupedTiles[tile_index] instead of the plan's tile (-1: the plan's), for the tests that run
// every compiled grouped kernel; tile_index in [-1, kGroupedTileCount), checked by module.cpp before the arguments.
void grouped_launch_tile(const fp8gemm::GroupedArgs& args, int tile_index);
int64_t grouped_workspace_bytes(int layout, int64_t m, int64_t n, int64_t k, int64_t groups);

}  // namespace fp8gemm_sm90a
