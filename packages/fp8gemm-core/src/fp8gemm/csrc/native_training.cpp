// The training layer's steady-state calls as torch dispatcher ops in C++ (part of the `_native_ops` library,
// native_ops.cpp): the transposing quantizer, the weight-gradient GEMM, and fp8gemm.training.linear's forward and
// backward (three launches each), each checks, allocation, stream and launches in one call. The arch module's
// optional training entries arrive through bind_training; an arch without one declines its op, and the Python planner
// (fp8gemm/training/quantize.py, fp8gemm/plans.py) runs instead.
#include <torch/csrc/stable/library.h>

#include <numeric>
#include <tuple>

#include "fp8gemm/linear_steps.hpp"  // align16
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

// The leading-dimension multiple of a transposed activation's MN-major scales, which both operands of the
// weight-gradient GEMM read in place (fp8gemm/training/quantize.py scale_t_layout).
int64_t transposed_scale_multiple() {
  const int64_t a = g.entries.a_scale_ld_multiple, b = g.training.wgrad_b_scale_ld_multiple;
  return g.training.wgrad_launch != nullptr && b > 0 ? std::lcm(a, b) : a;
}

// Where an operand and its transpose, each with its scales, are written: addresses and element strides.
struct QuantizedAt {
  uintptr_t q, scale, q_t, scale_t;
  int64_t scale_s0, scale_s1, scale_t_s0, scale_t_s1;
};

// The layouts fp8gemm/training/quantize.py's _outputs makes for a source of m rows of k: activations (blocks false)
// 1 x 128 scales along k, MN-major, and x^T over m_t = m rounded up to 128; weights (blocks true) 128 x 128 block
// scales, K-major, both ways. Offsets are bytes from one base, each piece 16-byte aligned.
struct QuantizedLayout {
  int64_t m, k, m_t, rows, kb;
  int64_t scale_s0, scale_s1, scale_t_s0, scale_t_s1;  // element strides
  int64_t q, scale, q_t, scale_t, bytes;                 // byte offsets, total bytes
  QuantizedLayout(int64_t m_, int64_t k_, bool blocks) : m(m_), k(k_) {
    m_t = blocks ? m : round_up(m, 128), rows = (m_t + 127) / 128, kb = k / 128;
    const int64_t b_mult = g.b_scale_ld_multiple;
    const int64_t scale_ld = blocks ? round_up(kb, b_mult) : a_scale_ld(m);
    const int64_t t_mult = transposed_scale_multiple();
    const int64_t scale_t_ld = blocks ? round_up(rows, b_mult) : std::max(round_up(k, t_mult), t_mult);
    scale_s0 = blocks ? scale_ld : 1, scale_s1 = blocks ? 1 : scale_ld;  // K-major (weights), else MN-major
    scale_t_s0 = blocks ? scale_t_ld : 1, scale_t_s1 = blocks ? 1 : scale_t_ld;
    const int64_t scale_elems = blocks ? rows * scale_ld : kb * scale_ld;
    const int64_t scale_t_elems = blocks ? kb * scale_t_ld : rows * scale_t_ld;
    q = 0, scale = fp8gemm::align16(m * k), q_t = scale + fp8gemm::align16(scale_elems * 4);
    scale_t = q_t + fp8gemm::align16(k * m_t), bytes = scale_t + fp8gemm::align16(scale_t_elems * 4);
  }
  QuantizedAt at(uintptr_t base) const {
    return {base + q, base + scale, base + q_t, base + scale_t, scale_s0, scale_s1, scale_t_s0, scale_t_s1};
  }
};

// The layout of x [..., k] (weights: 2-D) as a quantizer source: m rows of k.
QuantizedLayout layout_of(const Tensor& x, bool blocks) {
  need(x.dim() >= 1 && x.size(x.dim() - 1) > 0, "source shape");
  const int64_t k = x.size(x.dim() - 1);
  return QuantizedLayout(x.numel() / k, k, blocks);
}

// x quantized with its transpose at `at` (laid out as `layout`, layout_of(x)): the source's checks, then one launch.
void quantize_into(const Tensor& x, bool pow2_scales, bool blocks, const QuantizedLayout& layout,
                   const QuantizedAt& at, int32_t device, uintptr_t stream) {
  need(g.training.quantize_transposed != nullptr, "no transposing quantizer");
  need(x.is_cuda() && x.get_device_index() == device, "source device");
  const int kind = in_kind(x.scalar_type());
  need(!blocks || x.dim() == 2, "source shape");
  const auto [m, ldx] = rows_of(x, layout.k);
  need(m == layout.m && layout.m_t % 16 == 0, "rows of the transpose");
  g.training.quantize_transposed(fp8gemm::QuantizeTransposedArgs{
      address(x), at.q, at.scale, at.q_t, at.scale_t, m, layout.k, layout.m_t, ldx, at.scale_s0, at.scale_s1,
      at.scale_t_s0, at.scale_t_s1, kind, pow2_scales ? 1 : 0, blocks ? 1 : 0, 0, stream});
}

// An operand and its transpose, each with its scales, as tensors.
struct Quantized {
  Tensor q, scale, q_t, scale_t;
};

Tensor empty_of(int32_t device, int64_t rows, int64_t cols, int64_t s0, int64_t s1, ScalarType dtype) {
  return empty_strided(device, {rows, cols}, {s0, s1}, dtype);
}

// The transpose and its scales of x (laid out as `layout`) as tensors, what the backward keeps; the codes and scales
// the forward's GEMM reads written at `base`.
std::pair<Tensor, Tensor> quantize_keeping_transpose(const Tensor& x, bool pow2_scales, bool blocks,
                                                     const QuantizedLayout& layout, uintptr_t base, int32_t device,
                                                     uintptr_t stream) {
  Tensor q_t = empty(device, {layout.k, layout.m_t}, g.fp8);
  Tensor scale_t = empty_of(device, blocks ? layout.kb : layout.k, layout.rows, layout.scale_t_s0, layout.scale_t_s1,
                            ScalarType::Float);
  QuantizedAt at = layout.at(base);
  at.q_t = address(q_t), at.scale_t = address(scale_t);
  quantize_into(x, pow2_scales, blocks, layout, at, device, stream);
  return {q_t, scale_t};
}

// x [..., k] -> (q [m, k], scale, q_t [k, m_t], scale_t), each its own tensor (the quantize_transposed op).
Quantized quantize_both(const Tensor& x, bool pow2_scales, bool blocks, int32_t device, uintptr_t stream) {
  const QuantizedLayout l = layout_of(x, blocks);
  Quantized out{empty(device, {l.m, l.k}, g.fp8),
                empty_of(device, blocks ? l.rows : l.m, l.kb, l.scale_s0, l.scale_s1, ScalarType::Float),
                empty(device, {l.k, l.m_t}, g.fp8),
                empty_of(device, blocks ? l.kb : l.k, l.rows, l.scale_t_s0, l.scale_t_s1, ScalarType::Float)};
  const QuantizedAt at{address(out.q), address(out.scale), address(out.q_t), address(out.scale_t),
                       l.scale_s0, l.scale_s1, l.scale_t_s0, l.scale_t_s1};
  quantize_into(x, pow2_scales, blocks, l, at, device, stream);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_transposed(Tensor x, bool pow2_scales, bool blocks) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  Quantized out = quantize_both(x, pow2_scales, blocks, device, stream);
  return {out.q, out.scale, out.q_t, out.scale_t};
}

// out [m, n] (fp32, or bf16 without accumulate) <- (+=) a [m, k] b [n, k]^T, both with 1 x 128 scales along k: a's
// in the GEMM's A layout (lda, a_scale_ld), b's per row in the weight-gradient B layout (MN-major). a at raw addresses.
void wgrad_at(uintptr_t a, int64_t lda, uintptr_t a_scale, int64_t a_scale_ld, int64_t m, int64_t k, const Tensor& b,
              const Tensor& b_scale, const Tensor& out, bool accumulate, int32_t device, uintptr_t stream) {
  need(g.training.wgrad_launch != nullptr, "no weight-gradient GEMM");
  int64_t n = 0, k_b = 0;
  const auto [ldb, b_scale_ld] = fp8_rows_lds(b, b_scale, device, g.training.wgrad_b_scale_ld_multiple, &n, &k_b);
  need(k_b == k && n > 1 && n % 16 == 0, "b shape");
  const ScalarType t = out.scalar_type();
  need(t == ScalarType::Float || (t == ScalarType::BFloat16 && !accumulate), "out dtype");
  need(out.is_cuda() && out.get_device_index() == device && out.dim() == 2 && out.size(0) == m && out.size(1) == n,
       "out shape or device");
  const int64_t ldo = row_stride(out), size = t == ScalarType::Float ? 4 : 2;
  need(out.stride(1) == 1 && ldo >= n && (ldo * size) % 16 == 0 && aligned16(out), "out layout");
  const auto [buffer, workspace] = workspace_of(device, g.training.wgrad_workspace_bytes(m, n, k));
  g.training.wgrad_launch(fp8gemm::WgradArgs{
      a, address(b), a_scale, address(b_scale), address(out), workspace, m, n, k, lda, ldb,
      ldo, a_scale_ld, b_scale_ld, accumulate ? 1 : 0, t == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16,
      stream});
}

void wgrad_into(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale, const Tensor& out,
                bool accumulate, int32_t device, uintptr_t stream) {
  int64_t m = 0, k = 0;
  const auto [lda, a_scale_ld] = fp8_rows_lds(a, a_scale, device, g.entries.a_scale_ld_multiple, &m, &k);
  wgrad_at(address(a), lda, address(a_scale), a_scale_ld, m, k, b, b_scale, out, accumulate, device, stream);
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
// W^T with their scales). The bits of the Python path (fp8gemm/training/linear.py). The outputs are allocated, and
// one scratch allocation holds the rest (the codes and scales the GEMM reads, its workspace).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> linear_forward(Tensor x, Tensor weight, bool pow2_scales) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  need(x.scalar_type() == ScalarType::BFloat16, "activation dtype");
  need(weight.dim() == 2 && x.dim() >= 1 && weight.size(1) == x.size(x.dim() - 1) && weight.size(0) % 128 == 0 &&
           weight.size(1) > 0, "weight shape");
  const QuantizedLayout xl = layout_of(x, false), wl = layout_of(weight, true);
  const int64_t m = xl.m, n = wl.m, k = xl.k;
  need(m > 0, "no rows");
  const int64_t gemm_bytes = std::max<int64_t>(g.entries.workspace_bytes(m, n, k), 0);
  const Tensor scratch = empty(device, {xl.bytes + wl.bytes + gemm_bytes}, ScalarType::Byte);
  const uintptr_t x_at = address(scratch), w_at = x_at + xl.bytes;
  auto [x_q_t, x_scale_t] = quantize_keeping_transpose(x, pow2_scales, false, xl, x_at, device, stream);
  auto [w_q_t, w_scale_t] = quantize_keeping_transpose(weight, pow2_scales, true, wl, w_at, device, stream);
  Tensor y = empty(device, {m, n}, ScalarType::BFloat16);
  const GemmOperands o{x_at + xl.q, k, x_at + xl.scale, xl.scale_s1, w_at + wl.q, k, w_at + wl.scale, wl.scale_s0};
  gemm_at(o, y, m, n, k, gemm_bytes > 0 ? w_at + wl.bytes : 0, stream);
  return {y, x_q_t, x_scale_t, w_q_t, w_scale_t};
}

// Its backward for a bf16 dY [m, n] when x and the weight both need gradients: dY quantized with its transpose,
// dX = dY W (bf16 [m, k], on W^T) and dW = dY^T X ([n, k], bf16 or, with dw_fp32, fp32). The two gradients are
// allocated, and one scratch allocation holds dY's codes and scales and the GEMMs' workspaces.
std::tuple<Tensor, Tensor> linear_backward(Tensor dy, Tensor x_q_t, Tensor x_scale_t, Tensor w_q_t, Tensor w_scale_t,
                                           bool pow2_scales, bool dw_fp32) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(dy, &device);
  need(dy.scalar_type() == ScalarType::BFloat16 && dy.dim() == 2, "output gradient dtype or shape");
  need(g.training.wgrad_launch != nullptr, "no weight-gradient GEMM");  // before any launch: all or nothing
  const int64_t m = dy.size(0), n = dy.size(1), k = w_q_t.size(0);
  need(m > 0 && n > 0 && n % 128 == 0, "output gradient shape");
  need(w_q_t.dim() == 2 && w_q_t.size(1) == n && x_q_t.dim() == 2 && x_q_t.size(0) == k, "saved operand shapes");
  const auto [ldb, b_scale_ld] = weight_lds(w_q_t, w_scale_t, n, device);  // before any launch
  const QuantizedLayout dl(m, n, false);
  const int64_t gemm_bytes = std::max<int64_t>(g.entries.workspace_bytes(m, k, n), 0);
  const Tensor scratch = empty(device, {dl.bytes + gemm_bytes}, ScalarType::Byte);
  const uintptr_t d_at = address(scratch);
  quantize_into(dy, pow2_scales, false, dl, dl.at(d_at), device, stream);
  Tensor dx = empty(device, {m, k}, ScalarType::BFloat16);
  const GemmOperands o{d_at + dl.q, n, d_at + dl.scale, dl.scale_s1, address(w_q_t), ldb, address(w_scale_t),
                       b_scale_ld};
  gemm_at(o, dx, m, k, n, gemm_bytes > 0 ? d_at + dl.bytes : 0, stream);
  Tensor dw = empty(device, {n, k}, dw_fp32 ? ScalarType::Float : ScalarType::BFloat16);
  wgrad_at(d_at + dl.q_t, dl.m_t, d_at + dl.scale_t, dl.scale_t_s1, n, dl.m_t, x_q_t, x_scale_t, dw, false, device,
           stream);
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
