// What an arch package's native ops library (fp8gemm/csrc/native_*.cpp, built as `_native_ops`) calls: the arch
// module's entries, handed over once at load as the address of one NativeEntries (`_C.native_entries()`), so the
// kernels are compiled and linked once, into `_C`.
#pragma once
#include <cstdint>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// Raised with the struct: a library of another layout is refused at load.
constexpr uint32_t kNativeEntriesVersion = 2;

struct NativeEntries {
  uint32_t version;  // kNativeEntriesVersion
  uint32_t size;     // sizeof(NativeEntries)
  void (*launch)(const LaunchArgs&);
  int64_t (*workspace_bytes)(int64_t m, int64_t n, int64_t k);
  void (*quantize)(const QuantizeArgs&);
  int32_t a_scale_ld_multiple;  // of the MN-major A scales the GEMM reads and the quantizer writes
  // Grouped GEMM and fused_experts' step kernels (fp8gemm/arch_entry.hpp); null where the arch has none.
  void (*grouped_launch)(const GroupedArgs&);
  int64_t (*grouped_workspace_bytes)(int layout, int64_t m, int64_t n, int64_t k, int64_t groups);
  void (*moe_route)(const MoeRouteArgs&);
  void (*moe_activation)(const MoeActivationArgs&);
  void (*moe_combine)(const MoeCombineArgs&);
  int64_t (*moe_workspace_bytes)(int64_t tokens, int64_t top_k, int64_t experts);
};

// The optional training entries (fp8gemm/training_entries.hpp), handed over apart (`_C.native_training_entries()`,
// filled by backend_module.hpp's define_wgrad_entry and define_quantize_transposed_entry): null where the arch has none.
constexpr uint32_t kNativeTrainingEntriesVersion = 2;  // 2: QuantizeTransposedArgs.q_t_group

struct NativeTrainingEntries {
  uint32_t version;  // kNativeTrainingEntriesVersion
  uint32_t size;     // sizeof(NativeTrainingEntries)
  void (*quantize_transposed)(const QuantizeTransposedArgs&);
  void (*wgrad_launch)(const WgradArgs&);
  int64_t (*wgrad_workspace_bytes)(int64_t m, int64_t n, int64_t k);
  int32_t wgrad_b_scale_ld_multiple;  // of the MN-major per-row B scales wgrad_launch reads
};

}  // namespace fp8gemm
