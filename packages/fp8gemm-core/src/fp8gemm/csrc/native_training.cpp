// The training layer's steady-state calls as torch dispatcher ops in C++ (part of the `_native_ops` library,
// native_ops.cpp): the transposing quantizer, the weight-gradient GEMM, and fp8gemm.training.linear's forward and
// backward (three launches each), each checks, allocation, stream and launches in one call. The arch module's optional training entries arrive through bind_training; an arch without one
// declines its op, and the Python planner (fp8gemm/training/quantize.py, fp8gemm/plans.py) runs instead.
#include <torch/csrc/stable/library.h>

#include <numeric>
#include <tuple>

#include "native_common.hpp"

#ifndef FP8GEMM_OPS_NAMESPACE
#error "define FP8GEMM_OPS_NAMESPACE (the arch package's Python name, the ops' torch.library namespace)"
#endif

namespace {

using namespace fp8gemm_native;

void bind_training(int64_t entries) {
  const auto* e = reinterpret_cast<const fp8gemm::NativeTrainingEntries*>(static_cast<uintptr_t>(entries));
  if (!e || e->version != fp8gemm::kNativeTrainingEntriesVersion || e->size != sizeof(fp8gemm::NativeTrainingEntries))
    throw std::runtime_error("fp8gemm: the native ops library and the arch module are of different builds; "
                             "reinstall the arch package");
  g.training = *e;
}

// An uninitialised fp32 [rows, cols] scale matrix, K-major (strides (ld, 1)) or MN-major ((1, ld)), ld a multiple of
// mult: fp8gemm.runtime.empty_scale's.
Tensor empty_scale(int32_t device, int64_t rows, int64_t cols, bool k_major, int64_t mult) {
  if (k_major) return empty_strided(device, {rows, cols}, {round_up(cols, mult), 1}, ScalarType::Float);
  return empty_strided(device, {rows, cols}, {1, std::max(round_up(rows, mult), mult)}, ScalarType::Float);
}

// The leading-dimension multiple of a transposed activation's MN-major scales, which both operands of the
// weight-gradient GEMM read in place (fp8gemm/training/quantize.py scale_t_layout).
int64_t transposed_scale_multiple() {
  const int64_t a = g.entries.a_scale_ld_multiple, b = g.training.wgrad_b_scale_ld_multiple;
  return g.training.wgrad_launch != nullptr && b > 0 ? std::lcm(a, b) : a;
}

// An operand and its transpose, each with its scales.
struct Quantized {
  Tensor q, scale, q_t, scale_t;
};

// x [..., k] -> (q [m, k], scale, q_t [k, m_t], scale_t) in the layouts fp8gemm/training/quantize.py's _outputs makes:
// activations (blocks false) 1 x 128 scales along k, MN-major, and x^T over m_t = m rounded up to 128; weights
// (blocks true, x 2-D) 128 x 128 block scales, K-major, both ways.
Quantized quantize_both(const Tensor& x, bool pow2_scales, bool blocks, int32_t device, uintptr_t stream) {
  need(g.training.quantize_transposed != nullptr, "no transposing quantizer");
  need(x.is_cuda() && x.get_device_index() == device, "source device");
  const int kind = in_kind(x.scalar_type());
  need(x.dim() >= 1 && (!blocks || x.dim() == 2), "source shape");
  const int64_t k = x.size(x.dim() - 1);
  const auto [m, ldx] = rows_of(x, k);
  const int64_t m_t = blocks ? m : round_up(m, 128), rows = (m_t + 127) / 128, kb = k / 128;
  need(m_t % 16 == 0, "rows of the transpose");
  const int64_t b_mult = g.b_scale_ld_multiple;
  Quantized out{empty(device, {m, k}, g.fp8),
                blocks ? empty_scale(device, rows, kb, true, b_mult)
                       : empty_scale(device, m, kb, false, g.entries.a_scale_ld_multiple),
                empty(device, {k, m_t}, g.fp8),
                blocks ? empty_scale(device, kb, rows, true, b_mult)
                       : empty_scale(device, k, rows, false, transposed_scale_multiple())};
  g.training.quantize_transposed(fp8gemm::QuantizeTransposedArgs{
      address(x), address(out.q), address(out.scale), address(out.q_t), address(out.scale_t), m, k, m_t, ldx,
      out.scale.stride(0), out.scale.stride(1), out.scale_t.stride(0), out.scale_t.stride(1), kind, pow2_scales ? 1 : 0,
      blocks ? 1 : 0, stream});
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_transposed(Tensor x, bool pow2_scales, bool blocks) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  Quantized out = quantize_both(x, pow2_scales, blocks, device, stream);
  return {out.q, out.scale, out.q_t, out.scale_t};
}

// out [m, n] (fp32, or bf16 without accumulate) <- (+=) a [m, k] b [n, k]^T, both with 1 x 128 scales along k: a's
// in the GEMM's A layout, b's per row in the weight-gradient B layout (MN-major).
void wgrad_into(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale, const Tensor& out,
                bool accumulate, int32_t device, uintptr_t stream) {
  need(g.training.wgrad_launch != nullptr, "no weight-gradient GEMM");
  int64_t m = 0, k = 0, n = 0, k_b = 0;
  const auto [lda, a_scale_ld] = fp8_rows_lds(a, a_scale, device, g.entries.a_scale_ld_multiple, &m, &k);
  const auto [ldb, b_scale_ld] = fp8_rows_lds(b, b_scale, device, g.training.wgrad_b_scale_ld_multiple, &n, &k_b);
  need(k_b == k && n > 1 && n % 16 == 0, "b shape");
  const ScalarType t = out.scalar_type();
  need(t == ScalarType::Float || (t == ScalarType::BFloat16 && !accumulate), "out dtype");
  need(out.is_cuda() && out.get_device_index() == device && out.dim() == 2 && out.size(0) == m && out.size(1) == n,
       "out shape or device");
  const int64_t ldo = out.stride(0), size = t == ScalarType::Float ? 4 : 2;
  need(out.stride(1) == 1 && ldo >= n && (ldo * size) % 16 == 0 && aligned16(out), "out layout");
  const int64_t bytes = g.training.wgrad_workspace_bytes(m, n, k);
  Tensor workspace = empty(device, {bytes > 0 ? bytes : 1}, ScalarType::Byte);
  g.training.wgrad_launch(fp8gemm::WgradArgs{
      address(a), address(b), address(a_scale), address(b_scale), address(out), bytes > 0 ? address(workspace) : 0, m,
      n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld, accumulate ? 1 : 0,
      t == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16, stream});
}

Tensor wgrad(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, bool fp32_out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 2 && b.dim() == 2, "a or b not 2-D");
  Tensor out = empty(device, {a.size(0), b.size(0)}, fp32_out ? ScalarType::Float : ScalarType::BFloat16);
  wgrad_into(a, b, a_scale, b_scale, out, false, device, stream);
  return out;
}

void wgrad_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor out, bool accumulate) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  wgrad_into(a, b, a_scale, b_scale, out, accumulate, device, stream);
}

// fp8gemm.training.linear's forward on a bf16 x [..., k] without bias, in one call: x and the high-precision weight
// [n, k] quantized with their transposes, y = x W^T in bf16 [m, n]; returns y and what the backward keeps (x^T and
// W^T with their scales). The bits of the Python path (fp8gemm/training/linear.py).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> linear_forward(Tensor x, Tensor weight, bool pow2_scales) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  need(x.scalar_type() == ScalarType::BFloat16, "activation dtype");
  need(weight.dim() == 2 && x.dim() >= 1 && weight.size(1) == x.size(x.dim() - 1) && weight.size(0) % 128 == 0,
       "weight shape");
  Quantized xq = quantize_both(x, pow2_scales, false, device, stream);
  Quantized wq = quantize_both(weight, pow2_scales, true, device, stream);
  const int64_t m = xq.q.size(0), k = xq.q.size(1);
  Tensor y = empty(device, {m, weight.size(0)}, ScalarType::BFloat16);
  gemm_into(xq.q, wq.q, xq.scale, wq.scale, y, m, k, k, xq.scale.stride(1), device, stream);
  return {y, xq.q_t, xq.scale_t, wq.q_t, wq.scale_t};
}

// Its backward for a bf16 dY [m, n] when x and the weight both need gradients: dY quantized with its transpose,
// dX = dY W (bf16 [m, k], on W^T) and dW = dY^T X ([n, k], bf16 or, with dw_fp32, fp32).
std::tuple<Tensor, Tensor> linear_backward(Tensor dy, Tensor x_q_t, Tensor x_scale_t, Tensor w_q_t, Tensor w_scale_t,
                                           bool pow2_scales, bool dw_fp32) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(dy, &device);
  need(dy.scalar_type() == ScalarType::BFloat16 && dy.dim() == 2, "output gradient dtype or shape");
  need(g.training.wgrad_launch != nullptr, "no weight-gradient GEMM");  // before any launch: all or nothing
  const int64_t m = dy.size(0), n = dy.size(1), k = w_q_t.size(0);
  need(w_q_t.dim() == 2 && w_q_t.size(1) == n && x_q_t.dim() == 2 && x_q_t.size(0) == k, "saved operand shapes");
  Quantized dq = quantize_both(dy, pow2_scales, false, device, stream);
  Tensor dx = empty(device, {m, k}, ScalarType::BFloat16);
  gemm_into(dq.q, w_q_t, dq.scale, w_scale_t, dx, m, n, n, dq.scale.stride(1), device, stream);
  Tensor dw = empty(device, {n, k}, dw_fp32 ? ScalarType::Float : ScalarType::BFloat16);
  wgrad_into(dq.q_t, x_q_t, dq.scale_t, x_scale_t, dw, false, device, stream);
  return {dx, dw};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(FP8GEMM_OPS_NAMESPACE, m) {
  m.def("bind_training(int entries) -> ()");
  m.def("quantize_transposed(Tensor x, bool pow2_scales, bool blocks) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("wgrad(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, bool fp32_out) -> Tensor");
  m.def("wgrad_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor(a!) out, bool accumulate) -> ()");
  m.def("linear_forward(Tensor x, Tensor weight, bool pow2_scales) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("linear_backward(Tensor dy, Tensor x_q_t, Tensor x_scale_t, Tensor w_q_t, Tensor w_scale_t, bool pow2_scales, "
        "bool dw_fp32) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(FP8GEMM_OPS_NAMESPACE, CompositeExplicitAutograd, m) {
  m.impl("bind_training", TORCH_BOX(&bind_training));
}

STABLE_TORCH_LIBRARY_IMPL(FP8GEMM_OPS_NAMESPACE, CUDA, m) {
  m.impl("quantize_transposed", TORCH_BOX(&quantize_transposed));
  m.impl("wgrad", TORCH_BOX(&wgrad));
  m.impl("wgrad_out", TORCH_BOX(&wgrad_out));
  m.impl("linear_forward", TORCH_BOX(&linear_forward));
  m.impl("linear_backward", TORCH_BOX(&linear_backward));
}
