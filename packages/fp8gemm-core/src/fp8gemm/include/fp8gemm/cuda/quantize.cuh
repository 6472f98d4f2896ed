// The CUDA side of activation quantization (fp8gemm/quantize_rows.cuh), shared by every CUDA arch
// package: an arch's quantize.cu includes this and forwards its entry to launch_quantize.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/quantize_rows.cuh"

namespace fp8gemm::cuda {

struct E4m3Arch {
  static constexpr float kFp8Max = 448.0f;

  static __device__ __forceinline__ float group_max(float v) {
    const unsigned group_mask = 0xffffu << (threadIdx.x & 16);  // this block's 16 lanes: the others may have left
#pragma unroll
    for (int offset = kQuantLanes / 2; offset; offset >>= 1) v = nan_max(v, __shfl_xor_sync(group_mask, v, offset));
    return v;
  }

  template <int kIn>
  static __device__ __forceinline__ void load8(const uint8_t* p, float (&v)[8]) {
    if constexpr (kIn == kInFP32) {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(p)), hi = __ldg(reinterpret_cast<const float4*>(p) + 1);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float2 f;
        if constexpr (kIn == kInBF16) {
          f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
        } else {
          f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
        }
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
      }
    }
  }

  static __device__ __forceinline__ void store8(uint8_t* p, const float (&v)[8]) {
    uint32_t words[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w], v[4 * w + 1]), __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w + 2], v[4 * w + 3]), __NV_SATFINITE, __NV_E4M3);
      words[w] = lo | (hi << 16);
    }
    *reinterpret_cast<uint2*>(p) = make_uint2(words[0], words[1]);
  }
};

// blockIdx.x: the K block; blockIdx.y: kQuantRows rows (grid-strided past 65535 of them).
template <int kIn>
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(QuantizeParams p) {
  asm volatile("griddepcontrol.launch_dependents;");  // a GEMM launched next may start its prologue now
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * kQuantRows + threadIdx.x / kQuantLanes; row < p.m;
       row += static_cast<int64_t>(gridDim.y) * kQuantRows)
    quantize_group<E4m3Arch, kIn>(p, row, blockIdx.x, threadIdx.x % kQuantLanes);  // 16-lane groups stay whole
}

inline void launch_quantize(const QuantizeArgs& args, const char* package) {
  const QuantizeParams p = quantize_params(args);
  const int64_t k_blocks = args.k / kQuantBlock, row_blocks = (args.m + kQuantRows - 1) / kQuantRows;
  if (k_blocks > 0x7fffffff) throw std::invalid_argument(std::string(package) + ": quantize: K too large for one launch");
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  const dim3 grid(static_cast<unsigned>(k_blocks), static_cast<unsigned>(row_blocks < 65535 ? row_blocks : 65535));
  const dim3 block(kQuantThreads);
  switch (args.in_kind) {
    case kInBF16: quantize_kernel<kInBF16><<<grid, block, 0, stream>>>(p); break;
    case kInFP16: quantize_kernel<kInFP16><<<grid, block, 0, stream>>>(p); break;
    case kInFP32: quantize_kernel<kInFP32><<<grid, block, 0, stream>>>(p); break;
    default: throw std::invalid_argument(std::string(package) + ": quantize: unknown input kind");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(package) + ": quantize kernel launch: " + cudaGetErrorString(err));
}

}  // namespace fp8gemm::cuda
