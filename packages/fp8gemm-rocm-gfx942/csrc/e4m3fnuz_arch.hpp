// The e4m3fnuz Arch of the core's portable kernels (fp8gemm/quantize_rows.cuh, fp8gemm/quantize_tiles.cuh,
// fp8gemm/quantize_sources.cuh, fp8gemm/moe_steps.cuh) on gfx942: codes with bias 8 (max 240), a 16-lane max through
// ds_bpermute, 16-byte loads, the workgroup barrier, expf.
#pragma once
#include "hip_compat.hpp"
#include "fp8gemm/quantize_rows.cuh"

namespace fp8gemm_gfx942 {
namespace {

typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
typedef unsigned int u32x2 __attribute__((ext_vector_type(2)));

__device__ inline int lane_id() { return __builtin_amdgcn_workitem_id_x() & 63; }

struct E4m3fnuzArch {
  static constexpr float kFp8Max = 240.0f;

  static __device__ inline float group_max(float v) {
    for (int offset = fp8gemm::kQuantLanes / 2; offset; offset >>= 1) {
      const int other = __builtin_amdgcn_ds_bpermute((lane_id() ^ offset) << 2, static_cast<int>(fp8gemm::float_bits(v)));
      v = fp8gemm::nan_max(v, fp8gemm::bits_float(static_cast<uint32_t>(other)));
    }
    return v;
  }

  template <int kIn>
  static __device__ inline void load8(const uint8_t* p, float (&v)[8]) {
    if constexpr (kIn == fp8gemm::kInFP32) {
      const u32x4 lo = reinterpret_cast<const u32x4*>(p)[0], hi = reinterpret_cast<const u32x4*>(p)[1];
      for (int i = 0; i < 4; ++i) v[i] = fp8gemm::bits_float(lo[i]), v[4 + i] = fp8gemm::bits_float(hi[i]);
    } else {
      const u32x4 raw = *reinterpret_cast<const u32x4*>(p);
      for (int i = 0; i < 8; ++i) {
        const uint32_t half = (raw[i / 2] >> (16 * (i % 2))) & 0xffffu;
        if constexpr (kIn == fp8gemm::kInBF16) {
          v[i] = fp8gemm::bits_float(half << 16);
        } else {
          _Float16 h;
          const uint16_t bits = static_cast<uint16_t>(half);
          __builtin_memcpy(&h, &bits, 2);
          v[i] = static_cast<float>(h);
        }
      }
    }
  }

  // s_barrier between workgroup-scope release and acquire fences (HIP's __syncthreads()): LDS written before it is
  // visible after it.
  static __device__ inline void barrier() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  }

  // silu in fp8gemm/quantize_sources.cuh and fp8gemm/moe_steps.cuh; the builtin needs no device library
  static __device__ inline float exp(float v) { return __builtin_expf(v); }

  static __device__ inline void store8(uint8_t* p, const float (&v)[8]) {
    u32x2 words = {0u, 0u};
    for (int i = 0; i < 8; ++i) words[i / 4] |= static_cast<uint32_t>(fp8gemm::float_to_e4m3<8>(v[i])) << (8 * (i % 4));
    *reinterpret_cast<u32x2*>(p) = words;
  }
};

}  // namespace
}  // namespace fp8gemm_gfx942
