// Activation quantization, with and without a transpose (dense or per expert): the core's CUDA kernels (fp8gemm/cuda/quantize.cuh), built
// for this arch.
#include "fp8gemm/cuda/quantize.cuh"
#include "launch.hpp"

void fp8gemm_sm90a::quantize(const fp8gemm::QuantizeArgs& args) { fp8gemm::cuda::launch_quantize(args, "fp8gemm-cuda-sm90a"); }

void fp8gemm_sm90a::quantize_transposed(const fp8gemm::QuantizeTransposedArgs& args) {
  fp8gemm::cuda::launch_quantize_transposed(args, "fp8gemm-cuda-sm90a");
}

void fp8gemm_sm90a::quantize_grouped_transposed(const fp8gemm::QuantizeGroupedTransposedArgs& args) {
  fp8gemm::cuda::launch_quantize_grouped_transposed(args, "fp8gemm-cuda-sm90a");
}
