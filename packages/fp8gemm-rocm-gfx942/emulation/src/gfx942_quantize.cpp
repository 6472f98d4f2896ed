// The package's activation quantization kernels (csrc/quantize.hip: with and without a transpose, dense,
// per expert or per expert from a row source), unchanged, compiled
// for the CPU against the emulator's <hip/hip_runtime.h>, plus the kernels its enqueue functions launch.
#include "quantize.hip"

#include "gfx942_emu/kernels.hpp"

GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInBF16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInFP16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_kernel<fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_transposed_kernel<fp8gemm::kInBF16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_transposed_kernel<fp8gemm::kInFP16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_transposed_kernel<fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_transposed_kernel<fp8gemm::kInBF16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_transposed_kernel<fp8gemm::kInFP16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_transposed_kernel<fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceGather, fp8gemm::kInBF16, fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceGather, fp8gemm::kInFP16, fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceGather, fp8gemm::kInFP32, fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceSwiglu, fp8gemm::kInFP32, fp8gemm::kInFP32>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceSwigluBackward, fp8gemm::kInFP32, fp8gemm::kInBF16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceSwigluBackward, fp8gemm::kInFP32, fp8gemm::kInFP16>);
GFX942_EMU_KERNEL(fp8gemm_gfx942::quantize_grouped_source_kernel<fp8gemm::kSourceSwigluBackward, fp8gemm::kInFP32, fp8gemm::kInFP32>);
