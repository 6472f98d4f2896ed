// The split-K reduction of the CUDA arch packages: out = sum over splits of the fp32 partials
// ([splits][m][n], from the GEMM kernel), 4 columns per thread, in bf16 or fp32. Include in one
// translation unit per package (it defines a kernel).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp8gemm::cuda {
// Internal linkage: one library may link several arch packages, each with its own copy of these kernels.
namespace {

__global__ void reduce_splits(const float* __restrict__ partial, void* out, int m, int n, int64_t ldo, int splits,
                              int out_fp32) {
  const int64_t quads = int64_t(m) * n / 4;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < quads; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t idx = 4 * q;
    float4 s = __ldg(reinterpret_cast<const float4*>(partial + idx));
    for (int z = 1; z < splits; ++z) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(partial + int64_t(z) * m * n + idx));
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    const int64_t row = idx / n, col = idx % n;
    if (out_fp32) {
      *reinterpret_cast<float4*>(static_cast<float*>(out) + row * ldo + col) = s;
    } else {
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + row * ldo + col);
      dst[0] = __floats2bfloat162_rn(s.x, s.y);
      dst[1] = __floats2bfloat162_rn(s.z, s.w);
    }
  }
}

// Enqueue the reduction on `stream` with at most max_blocks blocks of 256 threads (n % 4 == 0).
inline void enqueue_reduce_splits(const float* partial, void* out, int m, int n, int64_t ldo, int splits, int out_fp32,
                                  int max_blocks, cudaStream_t stream) {
  const int64_t quads = int64_t(m) * n / 4;
  const int64_t blocks = (quads + 255) / 256;
  reduce_splits<<<static_cast<int>(blocks < max_blocks ? blocks : max_blocks), 256, 0, stream>>>(partial, out, m, n, ldo,
                                                                                                 splits, out_fp32);
}

}  // namespace
}  // namespace fp8gemm::cuda
