// The package's activation quantization kernel (csrc/quantize.hip), unchanged, compiled for the CPU
// against the emulator's <hip/hip_runtime.h>, plus the kernels its enqueue function launches.
#include "quantize.hip"

#include "gfx942_emu/kernels.hpp"

GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInBF16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInFP16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInFP32>);
