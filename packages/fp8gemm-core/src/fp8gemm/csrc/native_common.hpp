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
#include <optional>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
  fp8gemm::NativeTrainingEntries training{};  // null entries until bind_training (native_training.cpp)
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

// Allocation through torch's C shim (its caching allocator, on the current stream), not a dispatcher call by name:
// the steady-state call's allocations cost what torch.empty's C++ costs.
inline Tensor empty_strided(int32_t device, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                            ScalarType dtype) {
  AtenTensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                               static_cast<int32_t>(dtype), aoti_torch_device_type_cuda(), device,
                               &handle) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not allocate a tensor on cuda:" + std::to_string(device) +
                             " (its message is above)");
  return Tensor(handle);
}

// An uninitialised contiguous tensor of `sizes`.
inline Tensor empty(int32_t device, const std::vector<int64_t>& sizes, ScalarType dtype) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
  return empty_strided(device, sizes, strides, dtype);
}

// A plan's workspace: `bytes` of scratch where it needs any (the buffer, held until the launch is enqueued, and its
// address), else no allocation at all (address 0).
inline std::pair<std::optional<Tensor>, uintptr_t> workspace_of(int32_t device, int64_t bytes) {
  if (bytes <= 0) return {std::nullopt, 0};
  Tensor buffer = empty(device, {bytes}, ScalarType::Byte);
  const uintptr_t at = address(buffer);
  return {std::move(buffer), at};
}

// An uninitialised fp32 [m, kb] MN-major scale matrix (the quantizers' and the GEMMs' A layout) over a whole
// [kb, ld] allocation, and its leading dimension: fp8gemm.runtime.empty_scale's.
inline int64_t a_scale_ld(int64_t m) {
  const int64_t mult = g.entries.a_scale_ld_multiple;
  return std::max(round_up(m, mult), mult);
}
inline std::pair<Tensor, int64_t> empty_a_scale(int32_t device, int64_t m, int64_t kb) {
  const int64_t ld = a_scale_ld(m);
  Tensor whole = empty(device, {kb * ld}, ScalarType::Float);
  const int64_t sizes[2] = {m, kb}, strides[2] = {1, ld};
  AtenTensorHandle view = nullptr;
  if (aoti_torch__reinterpret_tensor(whole.get(), 2, sizes, strides, 0, &view) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not view the scales");
  return {Tensor(view), ld};
}

// The row stride (elements) of t [.., rows, cols] a kernel is handed: one row's, never stepped over and any value
// torch reports for a dim of size 1, is the row length (fp8gemm/runtime.py row_stride).
inline int64_t row_stride(const Tensor& t) {
  const int64_t d = t.dim();
  return t.size(d - 2) > 1 ? t.stride(d - 2) : t.size(d - 1);
}

// FP8 rows [.., rows, cols] (a weight, or one per group): contiguous along cols, rows and groups 16 bytes apart.
inline void need_fp8_rows(const Tensor& t, int32_t device, const char* what) {
  need_on(t, device, g.fp8, what);
  const int64_t d = t.dim(), ld = row_stride(t);
  need(t.stride(d - 1) == 1 && ld >= t.size(d - 1) && ld % 16 == 0 && aligned16(t), what);
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
  // one group: its stride is never applied, but a kernel's tensor map still wants it 16-byte aligned
  return {ld, groups == 1 ? (other * ld + 3) / 4 * 4 : s.stride(0)};
}

// x [..., k] as rows the kernels read in place: (m, ldx).
inline std::pair<int64_t, int64_t> rows_of(const Tensor& x, int64_t k) {
  need(x.dim() >= 1 && x.size(x.dim() - 1) == k && k > 0 && k % 128 == 0, "activation shape");
  const int64_t m = x.numel() / k, size = x.scalar_type() == ScalarType::Float ? 4 : 2;
  need(m > 0, "no rows");
  int64_t ldx = k;
  if (x.dim() == 2) {
    ldx = x.stride(0);
    need(x.stride(1) == 1 && ldx >= k, "activation layout");
  } else {
    need(x.is_contiguous(), "activation layout");
  }
  need((ldx * size) % 16 == 0 && aligned16(x), "activation alignment");
  return {m, ldx};
}

// a [m, k] FP8 and its MN-major scales [m, k/128] of leading-dimension multiple mult: (lda, a_scale_ld).
inline std::pair<int64_t, int64_t> fp8_rows_lds(const Tensor& a, const Tensor& a_scale, int32_t device, int64_t mult,
                                                int64_t* m, int64_t* k) {
  need_on(a, device, g.fp8, "a dtype or device");
  need_on(a_scale, device, ScalarType::Float, "a_scale dtype or device");
  need(a.dim() == 2 && a_scale.dim() == 2, "a or a_scale not 2-D");
  *m = a.size(0);
  *k = a.size(1);
  need(*m > 0 && *k > 0 && *k % 128 == 0 && a_scale.size(0) == *m && a_scale.size(1) == *k / 128, "a shape");
  const int64_t lda = a.stride(0);
  need(a.stride(1) == 1 && lda >= *k && lda % 16 == 0 && aligned16(a), "a layout");
  need(*m == 1 || a_scale.stride(0) == 1, "a_scale not MN-major");
  const int64_t ld = *k > 128 ? a_scale.stride(1) : std::max<int64_t>(a_scale.stride(1), *m);
  need(ld >= *m && ld % mult == 0 && aligned16(a_scale), "a_scale layout");
  return {lda, ld};
}

// The weight [n, k] (FP8, rows 16-byte aligned) and its scale [ceil(n/128), k/128] K-major: (ldb, b_scale_ld).
inline std::pair<int64_t, int64_t> weight_lds(const Tensor& b, const Tensor& b_scale, int64_t k, int32_t device) {
  need_on(b, device, g.fp8, "weight dtype or device");
  need_on(b_scale, device, ScalarType::Float, "weight scale dtype or device");
  need(b.dim() == 2 && b_scale.dim() == 2, "weight or scale not 2-D");
  const int64_t n = b.size(0), kb = k / 128, nb = (n + 127) / 128;
  need(b.size(1) == k && n > 0 && n % 16 == 0, "weight shape");
  need(b_scale.size(0) == nb && b_scale.size(1) == kb, "weight scale shape");
  const int64_t ldb = b.stride(0);
  need(b.stride(1) == 1 && ldb >= k && ldb % 16 == 0 && aligned16(b), "weight layout");
  need(kb == 1 || b_scale.stride(1) == 1, "weight scale not K-major");
  const int64_t ld = nb > 1 ? b_scale.stride(0) : std::max<int64_t>(b_scale.stride(0), kb);
  need(ld >= kb && ld % g.b_scale_ld_multiple == 0 && aligned16(b_scale), "weight scale layout");
  return {ldb, ld};
}

// One GEMM launch, out [m, n] <- a [m, k] b [n, k]^T on operands at raw addresses (a's scales MN-major, b's 128 x 128
// blocks K-major), the workspace g.entries.workspace_bytes(m, n, k) bytes at `workspace` (0 when none).
struct GemmOperands {
  uintptr_t a;
  int64_t lda;
  uintptr_t a_scale;
  int64_t a_scale_ld;
  uintptr_t b;
  int64_t ldb;
  uintptr_t b_scale;
  int64_t b_scale_ld;
};
inline void gemm_at(const GemmOperands& o, const Tensor& out, int64_t m, int64_t n, int64_t k, uintptr_t workspace,
                    uintptr_t stream) {
  g.entries.launch(fp8gemm::LaunchArgs{
      o.a, o.b, o.a_scale, o.b_scale, address(out), workspace, m, n, k, o.lda, o.ldb, row_stride(out), o.a_scale_ld,
      o.b_scale_ld, out.scalar_type() == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16, stream});
}

// out [m, n] <- a [m, k] b [n, k]^T, a's scales MN-major (a_scale_ld), b a weight with 128 x 128 block scales.
inline void gemm_into(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale, Tensor& out,
               int64_t m, int64_t k, int64_t lda, int64_t a_scale_ld, int32_t device, uintptr_t stream) {
  const auto [ldb, b_scale_ld] = weight_lds(b, b_scale, k, device);
  const GemmOperands o{address(a), lda, address(a_scale), a_scale_ld, address(b), ldb, address(b_scale), b_scale_ld};
  const int64_t n = b.size(0);
  const auto [buffer, workspace] = workspace_of(device, g.entries.workspace_bytes(m, n, k));
  gemm_at(o, out, m, n, k, workspace, stream);
}

}  // namespace fp8gemm_native
