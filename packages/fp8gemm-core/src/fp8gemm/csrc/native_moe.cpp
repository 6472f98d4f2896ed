// An arch package's fused_experts and grouped GEMMs (offs or masked) as torch dispatcher ops in C++ (see
// native_ops.cpp): the steady-state call in one C++ call, the same entries, buffers and bits as the Python steps
// (fp8gemm/moe_steps.py, fp8gemm/launch.py's run_grouped); anything else raises kMiss for the Python planner.
#include <torch/csrc/stable/library.h>

#include "fp8gemm/linear_steps.hpp"  // align16
#include "native_common.hpp"

namespace {

using namespace fp8gemm_native;

constexpr int64_t kMaxExperts = 1024, kMaxTopK = 1024;  // fp8gemm.protocol.MOE_MAX_EXPERTS, MOE_MAX_TOP_K

struct MoeSizes {
  int64_t tokens, top_k, experts, hidden, inter;
};

MoeSizes check_moe(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& w13,
                   const Tensor& w13_scale, const Tensor& w2, const Tensor& w2_scale, int32_t device) {
  need(g.entries.moe_route && g.entries.moe_activation && g.entries.moe_combine && g.entries.grouped_launch,
       "no step kernels");
  need(x.dim() == 2 && w13.dim() == 3 && w2.dim() == 3 && ids.dim() == 2 && weights.dim() == 2, "operand ranks");
  const MoeSizes s{x.size(0), ids.size(1), w13.size(0), x.size(1), w13.size(1) / 2};
  need(s.tokens > 0 && s.hidden > 0 && s.hidden % 128 == 0 && s.inter > 0 && s.inter % 128 == 0, "x or w13 shape");
  need(w13.size(1) == 2 * s.inter && w13.size(2) == s.hidden, "w13 shape");
  need(w2.size(0) == s.experts && w2.size(1) == s.hidden && w2.size(2) == s.inter, "w2 shape");
  need(s.experts >= 1 && s.experts <= kMaxExperts, "expert count");
  need(ids.size(0) == s.tokens && s.top_k >= 1 && s.top_k <= kMaxTopK && s.tokens * s.top_k <= 0x7fffffff,
       "topk_ids shape");
  need(weights.size(0) == s.tokens && weights.size(1) == s.top_k, "topk_weights shape");
  in_kind(x.scalar_type());
  const int64_t size = x.scalar_type() == ScalarType::Float ? 4 : 2;
  need(x.get_device_index() == device && x.stride(1) == 1 && x.stride(0) >= s.hidden &&
           (x.stride(0) * size) % 16 == 0 && aligned16(x), "x layout");
  const ScalarType id = ids.scalar_type(), weight = weights.scalar_type();
  need(ids.is_cuda() && ids.get_device_index() == device && (id == ScalarType::Int || id == ScalarType::Long) &&
           ids.is_contiguous(), "topk_ids dtype, device or layout");
  need(weights.is_cuda() && weights.get_device_index() == device && weights.is_contiguous() &&
           (weight == ScalarType::Float || weight == ScalarType::BFloat16 || weight == ScalarType::Half),
       "topk_weights dtype, device or layout");
  need_fp8_rows(w13, device, "w13 dtype, device or layout");
  need_fp8_rows(w2, device, "w2 dtype, device or layout");
  need(w13_scale.dim() == 3 && w13_scale.size(0) == s.experts && w13_scale.size(1) == 2 * s.inter / 128 &&
           w13_scale.size(2) == s.hidden / 128, "w13_scale shape");
  need(w2_scale.dim() == 3 && w2_scale.size(0) == s.experts && w2_scale.size(1) == (s.hidden + 127) / 128 &&
           w2_scale.size(2) == s.inter / 128, "w2_scale shape");
  return s;
}

// Where one fused_experts call keeps its intermediates, in one allocation (byte offsets, 16-byte aligned): the
// Python steps' tensors (fp8gemm/moe_steps.py), with their shapes and MN-major scale layouts.
struct MoeWorkspace {
  int64_t offs, position, route, q, q_scale, h, aq, a_scale, y, grouped, bytes;
  int64_t grouped_bytes;
  int64_t scale_ld;  // of both scale matrices: rows = tokens * top_k each
};

MoeWorkspace moe_workspace(const MoeSizes& s, int64_t y_size) {
  const int64_t rows = s.tokens * s.top_k, ld = a_scale_ld(rows);
  const int64_t grouped = std::max(
      g.entries.grouped_workspace_bytes(fp8gemm::kGroupedContiguous, rows, 2 * s.inter, s.hidden, s.experts),
      g.entries.grouped_workspace_bytes(fp8gemm::kGroupedContiguous, rows, s.hidden, s.inter, s.experts));
  const int64_t sizes[] = {s.experts * 4, rows * 4, g.entries.moe_workspace_bytes(s.tokens, s.top_k, s.experts),
                           rows * s.hidden, s.hidden / 128 * ld * 4, rows * 2 * s.inter * 4, rows * s.inter,
                           s.inter / 128 * ld * 4, rows * s.hidden * y_size, grouped};
  int64_t at[10], end = 0;
  for (int i = 0; i < 10; ++i) {
    at[i] = end;
    end += fp8gemm::align16(sizes[i]);
  }
  return {at[0], at[1], at[2], at[3], at[4], at[5], at[6], at[7], at[8], at[9],
          std::max<int64_t>(end, 16), grouped, ld};
}

// One contiguous grouped GEMM of the pipeline: out[r] = a[r] @ b[group(r)]^T, offs the groups' row ends.
void grouped_rows(uintptr_t a, const Tensor& b, uintptr_t a_scale, int64_t a_ld, const Tensor& b_scale,
                  std::pair<int64_t, int64_t> b_lds, uintptr_t offs, uintptr_t out, int64_t rows, int out_kind,
                  uintptr_t workspace, uintptr_t stream) {
  const int64_t n = b.size(1), k = b.size(2), ldo = n, ldb = row_stride(b);
  const int64_t b_gs = b.size(0) > 1 ? b.stride(0) : n * ldb;  // one expert's stride: its size (launch.py group_stride)
  g.entries.grouped_launch(fp8gemm::GroupedArgs{a, address(b), a_scale, address(b_scale), out, workspace, offs, rows,
                                                n, k, b.size(0), k, ldb, ldo, a_ld, b_lds.first, 0, b_gs, 0, 0,
                                                b_lds.second, 0, fp8gemm::kGroupedContiguous, out_kind, stream});
}

// out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, j]: route +
// quantize-scatter, the gate/up grouped GEMM, SiLU-and-mul + quantize, the down grouped GEMM, combine.
Tensor fused_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w13_scale, Tensor w2,
                     Tensor w2_scale, bool pow2_scales) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(x, &device);
  const MoeSizes s = check_moe(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, device);
  const auto w13_lds = group_scale_lds(w13_scale, device, true, g.b_scale_ld_multiple, "w13_scale layout");
  const auto w2_lds = group_scale_lds(w2_scale, device, true, g.b_scale_ld_multiple, "w2_scale layout");
  const int64_t rows = s.tokens * s.top_k;
  const int kind = in_kind(x.scalar_type()), pow2 = pow2_scales ? 1 : 0;
  const bool bf16 = x.scalar_type() == ScalarType::BFloat16;  // the down GEMM's output: bf16 for bf16 x, else fp32
  const int y_kind = bf16 ? fp8gemm::kOutBF16 : fp8gemm::kOutFP32;
  const MoeWorkspace w = moe_workspace(s, bf16 ? 2 : 4);
  Tensor out = empty(device, {s.tokens, s.hidden}, x.scalar_type());
  Tensor workspace = empty(device, {w.bytes}, ScalarType::Byte);  // last: freed to the stream once the call is queued
  const uintptr_t at = address(workspace), offs = at + w.offs, position = at + w.position, q = at + w.q;
  const uintptr_t q_scale = at + w.q_scale, h = at + w.h, aq = at + w.aq, a_scale = at + w.a_scale, y = at + w.y;
  const uintptr_t grouped = w.grouped_bytes ? at + w.grouped : 0;
  g.entries.moe_route(fp8gemm::MoeRouteArgs{
      address(topk_ids), address(x), q, q_scale, offs, position, w.q > w.route ? at + w.route : 0, s.tokens,
      s.top_k, s.experts, s.hidden, x.stride(0), w.scale_ld, topk_ids.scalar_type() == ScalarType::Long ? 1 : 0,
      kind, pow2, stream});
  grouped_rows(q, w13, q_scale, w.scale_ld, w13_scale, w13_lds, offs, h, rows, fp8gemm::kOutFP32, grouped, stream);
  g.entries.moe_activation(fp8gemm::MoeActivationArgs{h, aq, a_scale, offs, s.experts, s.inter, rows, 2 * s.inter,
                                                      w.scale_ld, pow2, stream});
  grouped_rows(aq, w2, a_scale, w.scale_ld, w2_scale, w2_lds, offs, y, rows, y_kind, grouped, stream);
  g.entries.moe_combine(fp8gemm::MoeCombineArgs{address(topk_weights), position, y, address(out), s.tokens, s.top_k,
                                                s.hidden, rows, s.hidden, s.hidden, kind,
                                                in_kind(topk_weights.scalar_type()), y_kind, stream});
  return out;
}

// Per-group row ends or counts: int32 [groups] on `device`, contiguous (the kernels read a plain array).
void need_group_rows(const Tensor& rows, int64_t groups, int32_t device, const char* what) {
  need(rows.is_cuda() && rows.get_device_index() == device && rows.scalar_type() == ScalarType::Int &&
           rows.dim() == 1 && rows.size(0) == groups && rows.is_contiguous(), what);
}

// A grouped GEMM's out [.., rows, n]: bf16 or fp32 on `device`, rows contiguous and 16-byte aligned; its row stride
// (elements) and element size.
std::pair<int64_t, int64_t> out_rows(const Tensor& out, int64_t n, int32_t device) {
  const ScalarType t = out.scalar_type();
  const int64_t size = t == ScalarType::Float ? 4 : 2, ldo = row_stride(out);
  need((t == ScalarType::BFloat16 || t == ScalarType::Float) && out.is_cuda() && out.get_device_index() == device,
       "out dtype or device");
  need(out.stride(out.dim() - 1) == 1 && ldo >= n && (ldo * size) % 16 == 0 && aligned16(out), "out layout");
  return {ldo, size};
}

// out[g, r] = a[g, r] @ b[g]^T for r < masked_m[g] (fp8gemm.grouped_gemm_masked): a [G, M_max, K] with MN-major
// scales per group, b [G, N, K] with K-major block scales; rows past masked_m[g] are neither computed nor written
// (`zeroed`: out set to 0 first, once every check has passed, so a declined call costs no fill).
void masked_into(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
                 const Tensor& masked_m, int64_t expected_m, Tensor& out, int32_t device, uintptr_t stream,
                 bool zeroed) {
  need(g.entries.grouped_launch != nullptr, "no grouped kernel");
  need(a.dim() == 3 && b.dim() == 3 && out.dim() == 3, "operand ranks");
  const int64_t groups = a.size(0), m = a.size(1), k = a.size(2), n = b.size(1);
  need(groups > 0 && m > 0 && k > 0 && k % 128 == 0 && n > 0 && n % 16 == 0, "shape");
  need(b.size(0) == groups && b.size(2) == k && out.size(0) == groups && out.size(1) == m && out.size(2) == n,
       "shape");
  need_fp8_rows(a, device, "a dtype, device or layout");
  need_fp8_rows(b, device, "b dtype, device or layout");
  need(a_scale.dim() == 3 && a_scale.size(0) == groups && a_scale.size(1) == m && a_scale.size(2) == k / 128,
       "a_scale shape");
  need(b_scale.dim() == 3 && b_scale.size(0) == groups && b_scale.size(1) == (n + 127) / 128 &&
           b_scale.size(2) == k / 128, "b_scale shape");
  const auto a_lds = group_scale_lds(a_scale, device, false, g.entries.a_scale_ld_multiple, "a_scale layout");
  const auto b_lds = group_scale_lds(b_scale, device, true, g.b_scale_ld_multiple, "b_scale layout");
  need_group_rows(masked_m, groups, device, "masked_m");
  const auto [ldo, size] = out_rows(out, n, device);
  need(groups == 1 || (out.stride(0) * size) % 16 == 0, "out layout");
  // One group's stride is never applied, and torch reports any value for a dim of size 1: the size of its rows
  // instead, a multiple of 16 bytes as every stride a backend is handed (fp8gemm/launch.py group_stride).
  const int64_t lda = row_stride(a), ldb = row_stride(b);
  const int64_t a_gs = groups == 1 ? m * lda : a.stride(0), b_gs = groups == 1 ? n * ldb : b.stride(0);
  const int64_t out_gs = groups == 1 ? m * ldo : out.stride(0);
  const int64_t bytes = g.entries.grouped_workspace_bytes(fp8gemm::kGroupedMasked, m, n, k, groups);
  const auto [buffer, workspace] = workspace_of(device, bytes);
  if (zeroed && aoti_torch_zero_(out.get()) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not zero out");
  g.entries.grouped_launch(fp8gemm::GroupedArgs{
      address(a), address(b), address(a_scale), address(b_scale), address(out), workspace,
      address(masked_m), m, n, k, groups, lda, ldb, ldo, a_lds.first, b_lds.first, a_gs, b_gs, out_gs,
      a_lds.second, b_lds.second, expected_m, fp8gemm::kGroupedMasked,
      out.scalar_type() == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16, stream});
}

Tensor grouped_gemm_masked(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor masked_m, int64_t expected_m,
                           bool fp32_out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 3 && b.dim() == 3, "operand ranks");
  // Zeroed (after the checks): the functional call's rows past masked_m[g] read 0 (fp8gemm.grouped_gemm_masked).
  Tensor out = empty(device, {a.size(0), a.size(1), b.size(1)}, fp32_out ? ScalarType::Float : ScalarType::BFloat16);
  masked_into(a, b, a_scale, b_scale, masked_m, expected_m, out, device, stream, true);
  return out;
}

void grouped_gemm_masked_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor masked_m, int64_t expected_m,
                             Tensor out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  masked_into(a, b, a_scale, b_scale, masked_m, expected_m, out, device, stream, false);
}

// offs' values on the host, as the planner checks them (one copy of G integers, which waits for the stream): the
// last row end where they are non-decreasing ends in [0, m]; anything else is the planner's, for its precise error.
int64_t checked_offs_end(const Tensor& offs, int64_t m) {
  const int64_t groups = offs.size(0), sizes[1] = {groups}, strides[1] = {1};
  std::vector<int32_t> ends(static_cast<size_t>(groups));
  AtenTensorHandle host = nullptr;
  if (aoti_torch_create_tensor_from_blob(ends.data(), 1, sizes, strides, 0, aoti_torch_dtype_int32(),
                                         aoti_torch_device_type_cpu(), 0, &host) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not wrap a host buffer for offs");
  const Tensor holder(host);
  if (aoti_torch_copy_(host, offs.get(), 0) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not copy offs to the host");
  int32_t previous = 0;
  for (const int32_t end : ends) {
    need(end >= previous && end <= m, "offs values");
    previous = end;
  }
  return previous;
}

// Rows [first, out.size(0)) of out set to 0: rows in no group read 0 (fp8gemm.grouped_gemm).
void zero_rows_from(Tensor& out, int64_t first) {
  const int64_t m = out.size(0), n = out.size(1);
  if (first >= m) return;
  AtenTensorHandle tail = nullptr;
  const int64_t sizes[2] = {m - first, n}, strides[2] = {n, 1};
  if (aoti_torch__reinterpret_tensor(out.get(), 2, sizes, strides, first * n, &tail) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8gemm: torch could not view out");
  const Tensor rows(tail);
  if (aoti_torch_zero_(tail) != AOTI_TORCH_SUCCESS) throw std::runtime_error("fp8gemm: torch could not zero out");
}

// out[r] = a[r] @ b[g]^T for the rows r of group g (fp8gemm.grouped_gemm): a [M, K] with MN-major scales, b [G, N, K]
// with K-major block scales. kGroupedContiguous: group_rows is offs, int32 [G] row ends ([offs[g-1], offs[g])), rows
// past offs[-1] not written; kGroupedRowIds: m_indices, int32 [M] each row's group, rows of id -1 not written. Rows
// from zero_from on are zeroed once every check has passed (a declined call leaves out as it was).
void rows_into(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
               const Tensor& group_rows, int layout, Tensor& out, int32_t device, uintptr_t stream,
               int64_t zero_from) {
  need(g.entries.grouped_launch != nullptr, "no grouped kernel");
  need(b.dim() == 3 && out.dim() == 2, "operand ranks");
  int64_t m = 0, k = 0;
  const auto [lda, a_scale_ld] = fp8_rows_lds(a, a_scale, device, g.entries.a_scale_ld_multiple, &m, &k);
  const int64_t groups = b.size(0), n = b.size(1);
  need(groups > 0 && n > 0 && n % 16 == 0 && b.size(2) == k && out.size(0) == m && out.size(1) == n, "shape");
  need_fp8_rows(b, device, "b dtype, device or layout");
  need(b_scale.dim() == 3 && b_scale.size(0) == groups && b_scale.size(1) == (n + 127) / 128 &&
           b_scale.size(2) == k / 128, "b_scale shape");
  const auto b_lds = group_scale_lds(b_scale, device, true, g.b_scale_ld_multiple, "b_scale layout");
  const bool ids = layout == fp8gemm::kGroupedRowIds;
  need_group_rows(group_rows, ids ? m : groups, device, ids ? "m_indices" : "offs");
  const int64_t ldo = out_rows(out, n, device).first;
  const int64_t ldb = row_stride(b), b_gs = groups == 1 ? n * ldb : b.stride(0);
  const auto [buffer, workspace] = workspace_of(device, g.entries.grouped_workspace_bytes(layout, m, n, k, groups));
  zero_rows_from(out, zero_from);
  g.entries.grouped_launch(fp8gemm::GroupedArgs{
      address(a), address(b), address(a_scale), address(b_scale), address(out), workspace, address(group_rows), m, n,
      k, groups, lda, ldb, ldo, a_scale_ld, b_lds.first, 0, b_gs, 0, 0, b_lds.second, 0, layout,
      out.scalar_type() == ScalarType::Float ? fp8gemm::kOutFP32 : fp8gemm::kOutBF16, stream});
}

// check_offs: an eager call outside CUDA-graph capture, whose offs the host reads first (the Python wrapper knows).
Tensor grouped_gemm(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor offs, bool check_offs, bool fp32_out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 2 && b.dim() == 3 && offs.dim() == 1 && a.size(0) > 0, "operand ranks");
  const int64_t m = a.size(0), end = check_offs ? checked_offs_end(offs, m) : 0;
  Tensor out = empty(device, {m, b.size(1)}, fp32_out ? ScalarType::Float : ScalarType::BFloat16);
  // Every row of a group is written, so with the ends known only the rows past them need zeros.
  rows_into(a, b, a_scale, b_scale, offs, fp8gemm::kGroupedContiguous, out, device, stream, end);
  return out;
}

void grouped_gemm_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor offs, bool check_offs, Tensor out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 2 && offs.dim() == 1 && a.size(0) > 0, "operand ranks");
  if (check_offs) checked_offs_end(offs, a.size(0));
  rows_into(a, b, a_scale, b_scale, offs, fp8gemm::kGroupedContiguous, out, device, stream, out.size(0));
}

// DeepGEMM's convention (fp8gemm.grouped_gemm with m_indices): the ids are read by the device alone, clamped there.
Tensor grouped_gemm_row_ids(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor m_indices, bool fp32_out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 2 && b.dim() == 3 && a.size(0) > 0, "operand ranks");
  Tensor out = empty(device, {a.size(0), b.size(1)}, fp32_out ? ScalarType::Float : ScalarType::BFloat16);
  // Every row zeroed: which rows have id -1 only the device knows.
  rows_into(a, b, a_scale, b_scale, m_indices, fp8gemm::kGroupedRowIds, out, device, stream, 0);
  return out;
}

void grouped_gemm_row_ids_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor m_indices, Tensor out) {
  int32_t device = 0;
  const uintptr_t stream = current_stream(a, &device);
  need(a.dim() == 2 && a.size(0) > 0, "operand ranks");
  rows_into(a, b, a_scale, b_scale, m_indices, fp8gemm::kGroupedRowIds, out, device, stream, out.size(0));
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(FP8GEMM_OPS_NAMESPACE, m) {
  m.def("fused_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w13_scale, Tensor w2, "
        "Tensor w2_scale, bool pow2_scales) -> Tensor");
  m.def("grouped_gemm_masked(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor masked_m, int expected_m, "
        "bool fp32_out) -> Tensor");
  m.def("grouped_gemm_masked_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor masked_m, "
        "int expected_m, Tensor(a!) out) -> ()");
  m.def("grouped_gemm(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor offs, bool check_offs, "
        "bool fp32_out) -> Tensor");
  m.def("grouped_gemm_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor offs, bool check_offs, "
        "Tensor(a!) out) -> ()");
  m.def("grouped_gemm_row_ids(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor m_indices, bool fp32_out) "
        "-> Tensor");
  m.def("grouped_gemm_row_ids_out(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor m_indices, "
        "Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(FP8GEMM_OPS_NAMESPACE, CUDA, m) {
  m.impl("fused_experts", TORCH_BOX(&fused_experts));
  m.impl("grouped_gemm_masked", TORCH_BOX(&grouped_gemm_masked));
  m.impl("grouped_gemm_masked_out", TORCH_BOX(&grouped_gemm_masked_out));
  m.impl("grouped_gemm", TORCH_BOX(&grouped_gemm));
  m.impl("grouped_gemm_out", TORCH_BOX(&grouped_gemm_out));
  m.impl("grouped_gemm_row_ids", TORCH_BOX(&grouped_gemm_row_ids));
  m.impl("grouped_gemm_row_ids_out", TORCH_BOX(&grouped_gemm_row_ids_out));
}
