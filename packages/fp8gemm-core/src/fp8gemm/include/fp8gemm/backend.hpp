// The C++ face of fp8gemm's backend protocol (docs/architecture.md, fp8gemm/protocol.py), shipped by
// fp8gemm-core for arch packages to build against: fp8gemm.get_include() gives this folder.
#pragma once
#include <cstdint>

namespace fp8gemm {

enum OutKind : int { kOutBF16 = 0, kOutFP32 = 1 };
enum InKind : int { kInBF16 = 0, kInFP16 = 1, kInFP32 = 2 };

// One launch: device pointers, sizes, leading dimensions in elements, the caller's stream. The core
// guarantees m >= 1, n % 16 == 0, k % 128 == 0, 16-byte aligned pointers and row strides, and
// scales in the layouts the backend declared.
struct LaunchArgs {
  uintptr_t a, b, a_scale, b_scale, out, workspace;
  int64_t m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld;
  int out_kind;
  uintptr_t stream;  // cudaStream_t / hipStream_t
};

// One activation quantization: x [m, k] (row stride ldx elements, InKind) -> q [m, k] FP8, contiguous,
// and fp32 scales [m, k/128] in the backend's a_scale_layout with leading dimension scale_ld. The core
// guarantees m >= 1, k % 128 == 0, 16-byte aligned pointers and x row stride.
struct QuantizeArgs {
  uintptr_t x, q, scale;
  int64_t m, k, ldx, scale_ld;
  int in_kind;
  int pow2;  // round each scale up to a power of two (UE8M0)
  uintptr_t stream;
};

// One Linear layer: x [m, k] float (row stride ldx elements, InKind) -> out [m, n] = quantize(x) @ b^T, with x
// quantized per 1 x 128 block exactly as QuantizeArgs describes. `workspace` holds the backend's
// linear_workspace_bytes(m, n, k, in_kind) bytes. Guarantees as for LaunchArgs and QuantizeArgs.
struct LinearArgs {
  uintptr_t x, b, b_scale, out, workspace;
  int64_t m, n, k, ldx, ldb, ldo, b_scale_ld;
  int out_kind, in_kind, pow2;
  uintptr_t stream;
};

}  // namespace fp8gemm
