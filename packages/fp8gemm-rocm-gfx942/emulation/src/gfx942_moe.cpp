// The package's mixture-of-experts step kernels (csrc/moe.hip), unchanged, compiled for the CPU against the
// emulator's <hip/hip_runtime.h>, plus the kernels its enqueue function launches.
#include "moe.hip"

#include "gfx942_emu/kernels.hpp"

GFX942_EMU_KERNEL(fp8gemm_gfx942::moe_count_kernel);
GFX942_EMU_KERNEL(fp8gemm_gfx942::moe_route_kernel);
GFX942_EMU_KERNEL(fp8gemm_gfx942::moe_scatter_kernel);
GFX942_EMU_KERNEL(fp8gemm_gfx942::moe_activation_kernel);
GFX942_EMU_KERNEL(fp8gemm_gfx942::moe_combine_kernel);
