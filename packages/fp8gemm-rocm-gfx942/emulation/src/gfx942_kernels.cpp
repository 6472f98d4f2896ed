// The package's kernels (csrc/kernels.hip), unchanged, compiled for the CPU against the emulator's
// <hip/hip_runtime.h>, plus the list of kernels its enqueue functions launch.
#include "kernels.hip"

#include "gfx942_emu/kernels.hpp"

GFX942_EMU_KERNEL(fp8gemm_gfx942::gemm_kernel<2, 2, 2, 2>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::gemm_kernel<1, 4, 1, 1>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::reduce_splits);
GFX942_EMU_KERNEL(fp8gemm_gfx942::wgrad_kernel<2, 2, 2, 2>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::wgrad_kernel<1, 4, 1, 1>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::kgrouped_wgrad_kernel<2, 2, 2, 2>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::kgrouped_wgrad_kernel<1, 4, 1, 1>);
