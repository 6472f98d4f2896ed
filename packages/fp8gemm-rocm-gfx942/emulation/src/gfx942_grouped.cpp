// The package's grouped kernel (csrc/grouped.hip), unchanged, compiled for the CPU against the emulator's
// <hip/hip_runtime.h>, plus the kernels its enqueue function launches.
#include "grouped.hip"

#include "gfx942_emu/kernels.hpp"

GFX942_EMU_KERNEL(fp8gemm_gfx942::grouped_kernel<fp8gemm_gfx942::Cfg128>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::grouped_kernel<fp8gemm_gfx942::Cfg32>);
