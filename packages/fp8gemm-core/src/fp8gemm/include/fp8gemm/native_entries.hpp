// What an arch package's native ops library (fp8gemm/native_ops.cpp, built as `_ops`) calls: the arch module's
// entries, handed over once at load as the address of one NativeEntries (`_C.native_entries()`), so the kernels are
// compiled and linked once, into `_C`.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// Raised with the struct: a library of another layout is refused at load.
constexpr uint32_t kNativeEntriesVersion = 1;

struct NativeEntries {
  uint32_t version;  // kNativeEntriesVersion
  uint32_t size;     // sizeof(NativeEntries)
  void (*launch)(const LaunchArgs&);
  int64_t (*workspace_bytes)(int64_t m, int64_t n, int64_t k);
  void (*quantize)(const QuantizeArgs&);
  int32_t a_scale_ld_multiple;  // of the MN-major A scales the GEMM reads and the quantizer writes
};

}  // namespace fp8gemm
