// The launch arguments as a kernel parameter block, for arch kernels that read A, B and the scales
// through plain pointers (the TMA kernels of sm90a carry tensor maps instead). Plain C++ (gfx942
// compiles it with a bare clang in HIP mode).
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

struct GemmParams {
  const uint8_t* a;      // [m, k] FP8, row stride lda (bytes)
  const uint8_t* b;      // [n, k] FP8, row stride ldb
  const float* a_scale;  // MN-major: a_scale[kb * sa_ld + row]
  const float* b_scale;  // K-major:  b_scale[(n / 128) * sb_ld + kb]
  void* out;             // [m, n] bf16 or fp32, row stride ldo (elements)
  float* partial;        // split-K: [split][m][n] fp32, else null
  int m, n, k;
  int64_t lda, ldb, ldo, sa_ld, sb_ld;
  int out_fp32;
  int kb_per_split;
};

// The operands, sizes and strides every parameter block takes from its arguments (LaunchArgs and GroupedArgs name
// them alike).
template <class Params, class Args>
inline void set_operands(Params& p, const Args& args) {
  p.a = reinterpret_cast<const uint8_t*>(args.a);
  p.b = reinterpret_cast<const uint8_t*>(args.b);
  p.a_scale = reinterpret_cast<const float*>(args.a_scale);
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.out = reinterpret_cast<void*>(args.out);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.lda = args.lda, p.ldb = args.ldb, p.ldo = args.ldo, p.sa_ld = args.a_scale_ld, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == kOutFP32;
}

// The parameter block of one launch in `splits` K splits of kb_per_split K blocks (partials in the
// workspace when splits > 1).
inline GemmParams gemm_params(const LaunchArgs& args, int splits, int kb_per_split) {
  GemmParams p{};
  set_operands(p, args);
  p.partial = splits > 1 ? reinterpret_cast<float*>(args.workspace) : nullptr;
  p.kb_per_split = kb_per_split;
  return p;
}

}  // namespace fp8gemm
