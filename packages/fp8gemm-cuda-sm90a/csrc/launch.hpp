// The C++ face of the backend protocol (docs/architecture.md): raw pointers, sizes, strides, stream.
#pragma once
#include <cstdint>

namespace fp8gemm_sm90a {

struct LaunchArgs {
  uintptr_t a, b, a_scale, b_scale, out, workspace;
  int64_t m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld;
  int out_kind;  // 0 = bf16, 1 = fp32
  uintptr_t stream;
};

void launch(const LaunchArgs& args);
int64_t workspace_bytes(int64_t m, int64_t n, int64_t k);

}  // namespace fp8gemm_sm90a
