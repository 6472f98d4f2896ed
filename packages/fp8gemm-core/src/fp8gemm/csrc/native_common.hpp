// What the native ops' sources share (native_ops.cpp: the dense ops and the library; native_moe.cpp: the grouped and
// mixture-of-experts ops): the bound entries, the current stream, and the checks of the steady-state call. A call
// that is not one raises an error starting with kMiss, and the Python wrapper then runs its checked planner.
#pragma once
#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "fp8gemm/native_entries.hpp"

namespace fp8gemm_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline constexpr const char* kMiss = "fp8gemm native path: ";  // fp8gemm/native.py's NATIVE_MISS

// torch's current-stream getter lives in its GPU library (libtorch_cuda, libtorch_hip), which a build against a CPU
// torch (conda's) cannot link: it is looked up at bind time in the one the process has loaded.
using StreamGetter = AOTITorchError (*)(int32_t device, void** stream);

struct Bound {
  fp8gemm::NativeEntries entries{};
  ScalarType fp8 = ScalarType::Float8_e4m3fn;
  int64_t b_scale_ld_multiple = 1;
  StreamGetter stream = nullptr;
  bool bound = false;
};
inline Bound g;

[[noreturn]] inline void miss(const std::string& why) { throw std::runtime_error(kMiss + why); }
inline void need(bool ok, const char* why) {
  if (!ok) miss(why);
}

inline StreamGetter find_stream_getter() {
  for (const char* library : {"libtorch_cuda.so", "libtorch_hip.so"}) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) continue;
    for (const char* name : {"aoti_torch_get_current_cuda_stream", "aoti_torch_get_current_hip_stream"})
      if (void* found = dlsym(handle, name)) return reinterpret_cast<StreamGetter>(found);
  }
  return nullptr;
}

inline uintptr_t address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }
inline bool aligned16(const Tensor& t) { return (address(t) & 15) == 0; }

// The tensor's device, which must be the current one (another device or a CUDA-graph capture elsewhere is the
// Python planner's), and that device's current stream.
inline uintptr_t current_stream(const Tensor& t, int32_t* device) {
  need(g.bound, "not bound");
  need(t.is_cuda(), "not a GPU tensor");
  *device = t.get_device_index();
  need(*device == torch::stable::accelerator::getCurrentDeviceIndex(), "not the current device");
  void* stream = nullptr;
  if (g.stream(*device, &stream) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch gave no current stream for the tensors' device");
  return reinterpret_cast<uintptr_t>(stream);
}

inline void need_on(const Tensor& t, int32_t device, ScalarType dtype, const char* what) {
  need(t.is_cuda() && t.get_device_index() == device && t.scalar_type() == dtype, what);
}

inline int in_kind(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: return fp8gemm::kInBF16;
    case ScalarType::Half: return fp8gemm::kInFP16;
    case ScalarType::Float: return fp8gemm::kInFP32;
    default: miss("activation dtype");
  }
}

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// An uninitialised fp32 [m, kb] MN-major scale matrix (the quantizers' and the GEMMs' A layout) and its leading
// dimension: fp8gemm.runtime.empty_scale's.
inline std::pair<Tensor, int64_t> empty_a_scale(const Tensor& like, int64_t m, int64_t kb) {
  const int64_t mult = g.entries.a_scale_ld_multiple, ld = std::max(round_up(m, mult), mult);
  Tensor by_block = torch::stable::new_empty(like, {kb, ld}, ScalarType::Float);
  Tensor by_row = torch::stable::transpose(by_block, 0, 1);
  return {torch::stable::narrow(by_row, 0, 0, m), ld};
}

// FP8 rows [.., rows, cols] (a weight, or one per group): contiguous along cols, rows and groups 16 bytes apart.
inline void need_fp8_rows(const Tensor& t, int32_t device, const char* what) {
  need_on(t, device, g.fp8, what);
  const int64_t d = t.dim();
  need(t.stride(d - 1) == 1 && t.stride(d - 2) >= t.size(d - 1) && t.stride(d - 2) % 16 == 0 && aligned16(t), what);
  need(d == 2 || t.size(0) == 1 || t.stride(0) % 16 == 0, what);
}

// Per-group scales [groups, rows, cols] with every group in the K-major (weights) or MN-major (activations) layout
// of leading-dimension multiple `mult`, each group 16-byte aligned: (ld, group stride).
inline std::pair<int64_t, int64_t> group_scale_lds(const Tensor& s, int32_t device, bool k_major, int64_t mult,
                                                   const char* what) {
  need_on(s, device, ScalarType::Float, what);
  need(s.dim() == 3 && aligned16(s), what);
  const int64_t groups = s.size(0);
  const int inner = k_major ? 2 : 1, outer = k_major ? 1 : 2;
  const int64_t extent = s.size(inner), other = s.size(outer);
  need(extent == 1 || s.stride(inner) == 1, what);
  const int64_t ld = other > 1 ? s.stride(outer) : std::max(s.stride(outer), extent);
  need(ld >= extent && ld % mult == 0, what);
  need(groups == 1 || s.stride(0) % 4 == 0, what);
  return {ld, s.stride(0)};
}

// The shared steps' grouped launch of contiguous rows: out[r] = a[r] @ b[g]^T for r in group g (offs: row ends).
inline void launch_contiguous(const Tensor& a, const Tensor& b, const Tensor& a_scale, int64_t a_scale_ld,
                              const Tensor& b_scale, std::pair<int64_t, int64_t> b_lds, const Tensor& offs,
                              Tensor& out, uintptr_t stream) {
  const int64_t m = a.size(0), n = b.size(1), k = b.size(2), groups = b.size(0);
  const int64_t bytes = g.entries.grouped_workspace_bytes(fp8gemm::kGroupedContiguous, m, n, k, groups);
  Tensor workspace = torch::stable::new_empty(a, {std::max<int64_t>(bytes, 1)}, ScalarType::Byte);
  g.entries.grouped_launch(fp8gemm::GroupedArgs{
      address(a), address(b), address(a_scale), address(b_scale), address(out), bytes > 0 ? address(workspace) : 0,
      address(offs), m, n, k, groups, a.stride(0), b.stride(1), out.stride(0), a_scale_ld, b_lds.first, 0,
      b.stride(0), 0, 0, b_lds.second, 0, fp8gemm::kGroupedContiguous,
      out.scalar_type() == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16, stream});
}

}  // namespace fp8gemm_native
