// This package's entry points, on the protocol's LaunchArgs (fp8gemm/backend.hpp), and the kernels'.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"
#include "heuristics.hpp"

namespace fp8gemm_gfx942 {

struct Params {
  const uint8_t* a;      // [m, k] FP8 e4m3fnuz, row stride lda (bytes)
  const uint8_t* b;      // [n, k] FP8 e4m3fnuz, row stride ldb
  const float* a_scale;  // MN-major: a_scale[kb * sa_ld + row]
  const float* b_scale;  // K-major:  b_scale[(n / 128) * sb_ld + kb]
  void* out;             // [m, n] bf16 or fp32, row stride ldo (elements)
  float* partial;        // split-K: [split][m][n] fp32, else null
  int m, n, k;
  int64_t lda, ldb, ldo, sa_ld, sb_ld;
  int out_fp32;
  int kb_per_split;
};

void launch(const fp8gemm::LaunchArgs& args);
int64_t workspace_bytes(int64_t m, int64_t n, int64_t k);
int cu_count();

// Defined in kernels.hip: enqueue the GEMM tiles / the split-K reduction; return a hipError_t.
int enqueue_gemm(const Params& p, const Geometry& g, void* stream);
int enqueue_reduce(const Params& p, int splits, int blocks, void* stream);

}  // namespace fp8gemm_gfx942
