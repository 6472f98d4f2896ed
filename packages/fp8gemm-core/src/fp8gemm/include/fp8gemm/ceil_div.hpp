// Integer division rounded up, for tile and block counts: one definition every arch's host code shares.
// Plain C++ without the standard library (gfx942 compiles it with a bare clang in HIP mode).
#pragma once
#include <cstdint>

namespace fp8gemm {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fp8gemm
