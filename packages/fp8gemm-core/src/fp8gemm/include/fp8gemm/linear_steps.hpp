// The Linear layer as two launches, for any arch with a quantize and a launch entry: x is quantized into
// the workspace (FP8 codes, then MN-major scales), then the GEMM reads them.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// Where the two-step path keeps its pieces in the workspace, 16-byte aligned each.
struct LinearWorkspace {
  int64_t q, scale, gemm;  // byte offsets: FP8 codes [m, k], scales [k / 128][scale_ld], the GEMM's workspace
  int64_t scale_ld, bytes;
};

inline int64_t align16(int64_t bytes) { return (bytes + 15) & ~int64_t(15); }

// scale_ld_multiple: the leading-dimension multiple of the arch's MN-major A-scale layout.
inline LinearWorkspace linear_workspace(int64_t m, int64_t k, int64_t gemm_bytes, int scale_ld_multiple) {
  LinearWorkspace w{};
  w.scale_ld = (m + scale_ld_multiple - 1) / scale_ld_multiple * scale_ld_multiple;
  w.q = 0;
  w.scale = align16(m * k);
  w.gemm = w.scale + align16(w.scale_ld * (k / 128) * 4);
  w.bytes = w.gemm + gemm_bytes;
  return w;
}

template <class Quantize, class Launch>
void linear_in_two_steps(const LinearArgs& a, const LinearWorkspace& w, Quantize quantize, Launch launch) {
  const uintptr_t q = a.workspace + w.q, scale = a.workspace + w.scale;
  quantize(QuantizeArgs{a.x, q, scale, a.m, a.k, a.ldx, w.scale_ld, a.in_kind, a.pow2, a.stream});
  launch(LaunchArgs{q, a.b, scale, a.b_scale, a.out, w.bytes > w.gemm ? a.workspace + w.gemm : 0, a.m, a.n, a.k, a.k,
                    a.ldb, a.ldo, w.scale_ld, a.b_scale_ld, a.out_kind, a.stream});
}

}  // namespace fp8gemm
