// Activation quantization, the algorithm every arch shares: float [m, k] -> FP8 [m, k] + one fp32
// scale per 1 x 128 block, bit-identical to fp8gemm.quantize_activation (the pure-torch reference).
//
// Portable C++ for CUDA, HIP and the host: an arch supplies a small `Arch` struct with
//   static constexpr float kFp8Max;                                   // 448 (e4m3fn), 240 (e4m3fnuz)
//   static FP8GEMM_QFN float group_max(float v);                      // NaN-propagating max over the 16 lanes
//   template <int kIn> static FP8GEMM_QFN void load8(const void* p, float (&v)[8]);  // 8 inputs -> fp32
//   static FP8GEMM_QFN void store8(uint8_t* p, const float (&v)[8]); // fp32 -> 8 FP8 codes, RNE, saturating
// and launches 16 lanes per block of 128 (8 elements each).
//
// Numerics (docs/quantization.md): scale = max(amax / fp8_max, FLT_MIN), where the floor keeps tiny
// inputs at full relative precision and gives all-zero blocks a finite scale; with pow2, rounded up to
// a power of two by its bits. q = fp8(x * (1 / scale)), round to nearest even, saturating. A NaN in a
// block makes its scale NaN; an infinity makes it infinite (so the GEMM row becomes NaN, as in bf16).
#pragma once
#include <stdint.h>

#include "fp8gemm/backend.hpp"

#ifndef FP8GEMM_QFN
#if defined(__CUDACC__) || defined(__HIP__)
#define FP8GEMM_QFN __device__ inline
#else
#define FP8GEMM_QFN inline  // a host-compiled file that includes this header for QuantizeParams
#endif
#endif

namespace fp8gemm {

constexpr int kQuantBlock = 128;          // elements per scale
constexpr int kQuantLanes = 16;           // lanes per block of 128
constexpr int kQuantElems = 8;            // elements per lane
constexpr int kQuantThreads = 256;        // threads per launched block
constexpr int kQuantRows = kQuantThreads / kQuantLanes;  // rows of one K block per launched block
constexpr float kFloatMinNormal = 1.17549435e-38f;

struct QuantizeParams {
  const uint8_t* x;  // bytes: rows are ldx_bytes apart
  uint8_t* q;        // [m, k] contiguous
  float* scale;      // MN-major: scale[kb * scale_ld + row]
  int64_t m, k, ldx_bytes, scale_ld;
  int pow2;
};

// The kernel's view of one QuantizeArgs (host side).
inline QuantizeParams quantize_params(const QuantizeArgs& args) {
  return QuantizeParams{reinterpret_cast<const uint8_t*>(args.x), reinterpret_cast<uint8_t*>(args.q),
                        reinterpret_cast<float*>(args.scale), args.m, args.k,
                        args.ldx * (args.in_kind == kInFP32 ? 4 : 2), args.scale_ld, args.pow2};
}

// Bytes of one input element of kind kKind (InKind).
template <int kKind>
constexpr int kInBytes = kKind == kInFP32 ? 4 : 2;

// torch's silu in fp32, rounded before any product (the experts' SiLU-and-mul and the quantizer's row sources); the
// Arch's exp is the expf its torch uses.
template <class Arch>
FP8GEMM_QFN float silu(float g) {
  return g / (1.0f + Arch::exp(-g));
}

FP8GEMM_QFN uint32_t float_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

FP8GEMM_QFN float bits_float(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// max that keeps a NaN from either side (fmaxf would drop it and hide a NaN block).
// The larger of a and b, NaN if either is (which NaN, and the sign of a zero maximum, change no scale).
FP8GEMM_QFN float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;  // one instruction, where the compare-and-select costs three or four
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (b > a || b != b) ? b : a;
#endif
}

FP8GEMM_QFN float block_scale(float amax, float fp8_max, bool pow2) {
  float s = amax / fp8_max;
  s = s < kFloatMinNormal ? kFloatMinNormal : s;  // a NaN compares false and stays
  const uint32_t u = float_bits(s);
  const bool finite = (u & 0x7f800000u) != 0x7f800000u;
  if (pow2 && finite && (u & 0x007fffffu)) return bits_float((u & 0xff800000u) + 0x00800000u);
  return s;
}

// One lane's share of the scale block (row, kb).
template <class Arch, int kIn>
FP8GEMM_QFN void quantize_group(const QuantizeParams& p, int64_t row, int64_t kb, int lane) {
  constexpr int kInBytes = kIn == 2 ? 4 : 2;
  const int64_t col = kb * kQuantBlock + lane * kQuantElems;
  float v[kQuantElems];
  Arch::template load8<kIn>(p.x + row * p.ldx_bytes + col * kInBytes, v);
  float amax = 0.f;
  for (int i = 0; i < kQuantElems; ++i) amax = nan_max(amax, __builtin_fabsf(v[i]));
  const float scale = block_scale(Arch::group_max(amax), Arch::kFp8Max, p.pow2 != 0);
  const float inv = 1.0f / scale;
  for (int i = 0; i < kQuantElems; ++i) v[i] *= inv;
  Arch::store8(p.q + row * p.k + col, v);
  if (lane == 0) p.scale[kb * p.scale_ld + row] = scale;
}

// Round-to-nearest-even, saturating float -> e4m3 code with exponent bias 7 (e4m3fn: max 448, NaN
// 0x7f/0xff, signed zero) or 8 (e4m3fnuz: max 240, NaN 0x80, no negative zero). Integer arithmetic
// only, for targets without a conversion instruction we can check against torch here.
template <int kBias>
FP8GEMM_QFN uint8_t float_to_e4m3(float x) {
  constexpr bool kFnuz = kBias == 8;
  constexpr uint32_t kMaxBits = kFnuz ? 0x43700000u : 0x43e00000u;  // 240.0f : 448.0f
  constexpr uint8_t kMaxCode = kFnuz ? 0x7f : 0x7e;
  constexpr int kMinNormalExp = 1 - kBias;
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kFnuz ? 0x80 : static_cast<uint8_t>(sign | 0x7f);
  uint32_t code;
  if (a >= kMaxBits) {
    code = kMaxCode;
  } else {
    const int exp = static_cast<int>(a >> 23) - 127;
    if (exp >= kMinNormalExp) {  // normal: keep 3 of 23 mantissa bits, ties to even
      const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
      code = r - (static_cast<uint32_t>(127 - kBias) << 3);
    } else if (exp < kMinNormalExp - 4) {  // below half the smallest subnormal
      code = 0;
    } else {  // subnormal: an integer multiple of 2^(kMinNormalExp - 3), ties to even
      const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
      const int shift = 23 - (exp - (kMinNormalExp - 3));
      uint32_t q = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
      q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
      code = q;
    }
  }
  if (kFnuz && code == 0) return 0;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8gemm
