// The e4m3fn Arch of the portable kernels (fp8gemm/quantize_rows.cuh, fp8gemm/moe_steps.cuh) on CUDA: a 16-lane
// NaN-keeping max through shuffles, 16-byte loads, the hardware's saturating FP8 conversion.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/quantize_rows.cuh"

namespace fp8gemm::cuda {

struct E4m3Arch {
  static constexpr float kFp8Max = 448.0f;
  static __device__ __forceinline__ float exp(float v) { return expf(v); }  // torch's silu on CUDA uses expf

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

}  // namespace fp8gemm::cuda
