// An arch package's GEMM, activation quantizer and Linear layer as torch dispatcher ops in C++: checks, output and
// scratch allocation, the current stream and the launches in one call from Python. Built by every arch package as
// its `_ops` library (fp8gemm_native_ops() in fp8gemm_arch_module.cmake) against PyTorch's stable ABI, so one build
// serves every torch from TORCH_TARGET_VERSION (2.10) on; the kernels stay in `_C`, whose entries `bind` receives.
//
// Each op takes exactly the steady-state call of the Python planner's fast path (fp8gemm/plans.py) and computes the
// same bits (the same entries, workspace layout and output layout). Any other call raises an error starting with
// kMiss, and the Python wrapper then runs the checked planner, which handles it or raises the precise error.
#include <torch/csrc/stable/library.h>

#include <tuple>
#include <vector>

#include "fp8gemm/linear_steps.hpp"
#include "native_common.hpp"

#ifndef FP8GEMM_OPS_NAMESPACE
#error "define FP8GEMM_OPS_NAMESPACE (the arch package's Python name, the ops' torch.library namespace)"
#endif

namespace {

using namespace fp8gemm_native;

void bind(int64_t entries, int64_t fp8_kind, int64_t b_scale_ld_multiple) {
  const auto* e = reinterpret_cast<const fp8gemm::NativeEntries*>(static_cast<uintptr_t>(entries));
  if (!e || e->version != fp8gemm::kNativeEntriesVersion || e->size != sizeof(fp8gemm::NativeEntries))
    throw std::runtime_error("fp8gemm: the native ops library and the arch module are of different builds; "
                             "reinstall the arch package");
  const StreamGetter stream = find_stream_getter();
  if (!stream)
    throw std::runtime_error("fp8gemm: this process has no GPU build of torch loaded (libtorch_cuda or libtorch_hip)");
  g.entries = *e;
  g.fp8 = fp8_kind ? ScalarType::Float8_e4m3fnuz : ScalarType::Float8_e4m3fn;
  g.b_scale_ld_multiple = b_scale_ld_multiple;
  g.stream = stream;
  g.bound = true;
}

std::vector<int64_t> with_last(const Tensor& x, int64_t last) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) shape.push_back(x.size(d));
  shape.push_back(last);
  return shape;
}

Tensor linear(Tensor x, Tensor weight, Tensor weight_scale, bool pow2_scales) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  // bf16 only: fp16 and fp32 go through an fp32 GEMM and a conversion, the Python planner's
  need(x.scalar_type() == ScalarType::BFloat16, "activation dtype");
  need(weight.dim() == 2, "weight not 2-D");
  const int64_t n = weight.size(0), k = weight.size(1);
  const auto [m, ldx] = rows_of(x, k);
  const auto [ldb, b_scale_ld] = weight_lds(weight, weight_scale, k, device);
  need(g.entries.quantize != nullptr, "no quantization kernel");
  Tensor y = empty(device, with_last(x, n), ScalarType::BFloat16);
  const fp8gemm::LinearWorkspace w =
      fp8gemm::linear_workspace(m, k, g.entries.workspace_bytes(m, n, k), g.entries.a_scale_ld_multiple);
  Tensor workspace = empty(device, {w.bytes}, ScalarType::Byte);
  const fp8gemm::LinearArgs args{address(x), address(weight), address(weight_scale), address(y), address(workspace),
                                 m, n, k, ldx, ldb, n, b_scale_ld, fp8gemm::kOutBF16, fp8gemm::kInBF16,
                                 pow2_scales ? 1 : 0, stream};
  fp8gemm::linear_in_two_steps(args, w, g.entries.quantize, g.entries.launch);
  return y;
}

Tensor gemm(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, bool fp32_out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  int64_t m = 0, k = 0;
  const auto [lda, a_scale_ld] = fp8_rows_lds(a, a_scale, device, g.entries.a_scale_ld_multiple, &m, &k);
  need(b.dim() == 2, "b not 2-D");
  Tensor out = empty(device, {m, b.size(0)}, fp32_out ? ScalarType::Float : ScalarType::BFloat16);
  gemm_into(a, b, a_scale, b_scale, out, m, k, lda, a_scale_ld, device, stream);
  return out;
}

void gemm_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  int64_t m = 0, k = 0;
  const auto [lda, a_scale_ld] = fp8_rows_lds(a, a_scale, device, g.entries.a_scale_ld_multiple, &m, &k);
  need(b.dim() == 2 && out.dim() == 2 && out.size(0) == m && out.size(1) == b.size(0), "out shape");
  const ScalarType t = out.scalar_type();
  need((t == ScalarType::BFloat16 || t == ScalarType::Float) && out.is_cuda() && out.get_device_index() == device,
       "out dtype or device");
  const int64_t ldo = out.stride(0), size = t == ScalarType::Float ? 4 : 2;
  need(out.stride(1) == 1 && ldo >= out.size(1) && (ldo * size) % 16 == 0 && aligned16(out), "out layout");
  gemm_into(a, b, a_scale, b_scale, out, m, k, lda, a_scale_ld, device, stream);
}

std::tuple<Tensor, Tensor> quantize_activation(Tensor x, bool pow2_scales) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  const int kind = in_kind(x.scalar_type());
  need(g.entries.quantize != nullptr, "no quantization kernel");
  need(x.dim() >= 1, "activation shape");
  const int64_t k = x.size(x.dim() - 1);
  const auto [m, ldx] = rows_of(x, k);
  Tensor q = empty(device, {m, k}, g.fp8);
  auto [scale, ld] = empty_a_scale(device, m, k / 128);
  g.entries.quantize(
      fp8gemm::QuantizeArgs{address(x), address(q), address(scale), m, k, ldx, ld, kind, pow2_scales ? 1 : 0, stream});
  return {q, scale};
}

}  // namespace

#define FP8GEMM_NATIVE_LIBRARY(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define FP8GEMM_NATIVE_LIBRARY_IMPL(ns, key, m) STABLE_TORCH_LIBRARY_IMPL(ns, key, m)

FP8GEMM_NATIVE_LIBRARY(FP8GEMM_OPS_NAMESPACE, m) {
  m.def("bind(int entries, int fp8_kind, int b_scale_ld_multiple) -> ()");
  m.def("linear(Tensor x, Tensor weight, Tensor weight_scale, bool pow2_scales) -> Tensor");
  m.def("gemm(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, bool fp32_out) -> Tensor");
  m.def("gemm_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor(a!) out) -> ()");
  m.def("quantize_activation(Tensor x, bool pow2_scales) -> (Tensor, Tensor)");
}

FP8GEMM_NATIVE_LIBRARY_IMPL(FP8GEMM_OPS_NAMESPACE, CompositeExplicitAutograd, m) {
  m.impl("bind", TORCH_BOX(&bind));
}

FP8GEMM_NATIVE_LIBRARY_IMPL(FP8GEMM_OPS_NAMESPACE, CUDA, m) {
  m.impl("linear", TORCH_BOX(&linear));
  m.impl("gemm", TORCH_BOX(&gemm));
  m.impl("gemm_out", TORCH_BOX(&gemm_out));
  m.impl("quantize_activation", TORCH_BOX(&quantize_activation));
}
