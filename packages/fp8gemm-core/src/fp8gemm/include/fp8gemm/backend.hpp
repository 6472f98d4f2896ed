// The C++ face of fp8gemm's backend protocol (docs/architecture.md, fp8gemm/protocol.py), shipped by
// fp8gemm-core for arch packages to build against: fp8gemm.get_include() gives this folder.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fp8gemm {

// The protocol's version: every entry reads its arguments as one struct behind a {version, size} header
// (Wire below) at an address the core passes, and the core refuses an arch package built for another version.
constexpr uint32_t kProtocolVersion = 3;

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

// Grouped GEMMs (mixture of experts): `groups` GEMMs with one B [n, k] each, at b + g * b_group_stride (scales
// likewise). layout kGroupedContiguous: a and out hold m rows grouped by expert and group_rows is int32 [groups]
// of cumulative row ends (group g = rows [ends[g-1], ends[g])); kGroupedMasked: group g's a and out start
// g * a_group_stride / out_group_stride elements in, m is the rows per group and group_rows int32 [groups] the rows
// to compute (the rest is neither computed nor written); kGroupedRowIds: group_rows is int32 [m], each row's
// group (-1: not written). Values in group_rows are seen only by the device: a kernel clamps each end to
// [previous end, m] (groups never overlap), rows to [0, m], ids to [-1, groups), and never reads or writes outside
// the tensors. expected_m: the caller's hint of rows per
// group (0: none). Guarantees otherwise as for LaunchArgs.
enum GroupedLayout : int { kGroupedContiguous = 0, kGroupedMasked = 1, kGroupedRowIds = 2 };
struct GroupedArgs {
  uintptr_t a, b, a_scale, b_scale, out, workspace, group_rows;
  int64_t m, n, k, groups, lda, ldb, ldo, a_scale_ld, b_scale_ld;
  int64_t a_group_stride, b_group_stride, out_group_stride, a_scale_group_stride, b_scale_group_stride, expected_m;
  int layout, out_kind;
  uintptr_t stream;
};

// The step kernels of fused_experts' pipeline (fp8gemm/moe_steps.cuh, docs/moe.md "Steps"): one entry and one struct
// per kernel, each holding what that kernel reads, enqueued on `stream`. The core guarantees 1 <= experts <= 1024,
// 1 <= top_k <= 1024, hidden and inter multiples of 128, tokens * top_k < 2^31, 16-byte aligned pointers and row
// strides; values only the device reads (ids, offs, positions) are clamped.
//
// moe_route, route + quantize-scatter: ids [tokens, top_k] (id_kind 0 int32, 1 int64) -> offs int32 [experts]
// (cumulative row ends), position int32 [tokens, top_k] (each slot's row in expert order, stable; -1 for an id outside
// [0, experts)), and x [tokens, hidden] (row stride ldx, in_kind) quantized once per token into each of its rows of q
// (FP8 [tokens * top_k, hidden]) and scale (MN-major, scale_ld); workspace: moe_workspace_bytes(tokens, top_k,
// experts) bytes.
struct MoeRouteArgs {
  uintptr_t ids, x, q, scale, offs, position, workspace;
  int64_t tokens, top_k, experts, hidden, ldx, scale_ld;
  int id_kind, in_kind, pow2;
  uintptr_t stream;
};

// moe_activation, SiLU-and-mul + quantize: h fp32 [rows, 2 inter] (row stride ldh; gate then up) -> silu(gate) * up
// quantized into q (FP8 [rows, inter]) and scale (MN-major, scale_ld); rows >= offs[experts - 1] (read on the device)
// are skipped.
struct MoeActivationArgs {
  uintptr_t h, q, scale, offs;
  int64_t experts, inter, rows, ldh, scale_ld;
  int pow2;
  uintptr_t stream;
};

// moe_combine: out [tokens, hidden] (out_kind, an InKind: x's dtype; row stride ldo) = sum over j of weights[t, j]
// (weight_kind, an InKind) * y[position[t, j]] (y_kind an OutKind, row stride ldy, `rows` rows), in fp32, j in order,
// -1 skipped.
struct MoeCombineArgs {
  uintptr_t weights, position, y, out;
  int64_t tokens, top_k, hidden, rows, ldy, ldo;
  int out_kind, weight_kind, y_kind;
  uintptr_t stream;
};

// The weight-gradient GEMM (optional entry wgrad_launch, fp8gemm/training_entries.hpp; docs/training.md): both operands carry
// 1 x 128 scales along the contracted dim K (the tokens), "1D1D":
//   out[m, n] (+)= sum_k a[m, k] * b[n, k] * a_scale[m, k / 128] * b_scale[n, k / 128]
// a [m, k] and b [n, k] FP8 (row strides lda, ldb); a_scale [m, k/128] in the backend's a_scale_layout (leading
// dimension a_scale_ld), b_scale [n, k/128] per row of b in its wgrad_b_scale_layout (b_scale_ld); out [m, n] (row
// stride ldo) fp32 or bf16 (out_kind); accumulate 0 writes out, 1 adds the product into it (out += product, the product
// in fp32 first; fp32 out only).
// `workspace` holds the backend's wgrad_workspace_bytes(m, n, k) bytes. Guarantees as for LaunchArgs (k is a multiple
// of 128: a token count that is not is zero-padded by the caller, fp8gemm.training.quantize_with_transpose).
struct WgradArgs {
  uintptr_t a, b, a_scale, b_scale, out, workspace;
  int64_t m, n, k, lda, ldb, ldo, a_scale_ld, b_scale_ld;
  int accumulate;
  int out_kind;  // OutKind: kOutFP32, or kOutBF16 (the product rounded once, for a bf16 weight's gradient)
  uintptr_t stream;
};

// Quantization with a transpose (optional entry quantize_transposed, fp8gemm/training_entries.hpp; docs/training.md):
// x [m, k] float (row stride ldx elements, InKind; k a multiple of 128) -> q FP8 [m, k] contiguous and q_t FP8
// [k, m_t] contiguous (x transposed; m <= m_t, m_t a multiple of 16, columns m..m_t-1 quantized from zeros), one read
// of x. blocks 0 (activations): q with one scale per 1 x 128 along k (QuantizeArgs' codes), scale (row, k block) at
// scale[row * scale_s0 + kb * scale_s1]; q_t with one scale per 1 x 128 along m, (column, row block) at
// scale_t[c * scale_t_s0 + rb * scale_t_s1], rb < ceil(m_t / 128). blocks 1 (weights): one scale per 128 x 128
// tile for both, (row block, k block) in scale and (k block, row block) in scale_t, q_t the codes of q transposed
// (m_t = m). q_t_group 0 keeps q_t one matrix; else (a multiple of 128 dividing m_t) q_t is m_t / q_t_group
// matrices [k, q_t_group] one after another, column c of the transpose at column c % q_t_group of matrix
// c / q_t_group (the experts' W^T [E, K, N] from their stacked [E N, K] weights). Guarantees as for QuantizeArgs.
struct QuantizeTransposedArgs {
  uintptr_t x, q, scale, q_t, scale_t;
  int64_t m, k, m_t, ldx, scale_s0, scale_s1, scale_t_s0, scale_t_s1;
  int in_kind, pow2, blocks;
  int64_t q_t_group;
  uintptr_t stream;
};

// The grouped transposing quantizer (optional entry quantize_grouped_transposed, fp8gemm/training_entries.hpp;
// docs/training.md "Mixture-of-experts layers"): x [m, k] float (row stride ldx elements, InKind; rows sorted by
// expert) and offs int32 [experts] (cumulative row ends, seen only by the device: each end clamped to [previous end,
// m]) -> q FP8 [m, k] contiguous with (row, k block) scales at scale[row * scale_s0 + kb * scale_s1], exactly
// QuantizeArgs' codes for every row (rows past the last end included), and x^T as q_t FP8 [k, columns] contiguous in
// the per-expert 128-aligned layout (columns = 128 * (experts + m / 128 + 1); expert e's tokens from column block
// e + start_e / 128), one scale per 1 x 128 along the tokens, (column, column block) at
// scale_t[c * scale_t_s0 + b * scale_t_s1]; gap blocks zero codes and the all-zero block's scale. One read of x.
// The core guarantees m >= 1, 1 <= experts < 2^31, k a multiple of 128, 16-byte aligned pointers and row strides of
// x and gate_up. `source` says what the rows are (fp8gemm/quantize_sources.cuh has the exact arithmetic, all of it in fp32):
//   kSourceRows: x's rows;
//   kSourceGather: row r is x[index[r]] (index int64 [m]; x [source_rows, k]; an index outside [0, source_rows)
//     reads a zero row), times row_weight[r] (fp32 [m]) where row_weight is not 0;
//   kSourceSwiglu: x is h fp32 [m, 2k] (in_kind kInFP32): row r is silu(h[r, :k]) * h[r, k:];
//   kSourceSwigluBackward: x is d fp32 [m, k/2] (in_kind kInFP32), gate_up h [m, k] (gate_up_kind, row stride
//     ld_gate_up elements; k/2 a multiple of 128): row r is [silu'(g) * (d * u) | silu(g) * d], g, u h's halves.
enum RowSourceKind { kSourceRows = 0, kSourceGather = 1, kSourceSwiglu = 2, kSourceSwigluBackward = 3 };
struct QuantizeGroupedTransposedArgs {
  uintptr_t x, q, scale, q_t, scale_t, offs;
  int64_t m, k, experts, columns, ldx, scale_s0, scale_s1, scale_t_s0, scale_t_s1;
  int in_kind, pow2;
  uintptr_t index, row_weight, gate_up;
  int64_t source_rows, ld_gate_up;
  int source, gate_up_kind;
  uintptr_t stream;
};

// The k-grouped weight-gradient GEMM (optional entry kgrouped_wgrad_launch, fp8gemm/training_entries.hpp;
// docs/training.md "Mixture-of-experts layers"): for every expert e < experts, the WgradArgs product over expert e's own
// K blocks of the per-expert 128-aligned layout (fp8gemm.training.quantize_grouped_with_transpose):
//   out[e][m, n] (+)= sum over k in e's blocks of a[m, k] * b[n, k] * a_scale[m, k / 128] * b_scale[n, k / 128]
// offs int32 [experts] holds the cumulative token ends, read only on the device, each clamped to [previous end,
// k - 128 * experts - 1]; expert e (tokens [start_e, end_e)) owns K blocks [e + start_e / 128, that + ceil((end_e -
// start_e) / 128)). out[e] sits at out + e * out_es elements, rows ldo apart. An expert without tokens gets zeros, or
// keeps out[e] untouched with accumulate. Operands and scales as WgradArgs' (k = 128 * (experts + tokens / 128 + 1));
// the core guarantees 1 <= experts <= kKGroupedMaxExperts and no workspace.
constexpr int kKGroupedMaxExperts = 2048;
struct KGroupedWgradArgs {
  uintptr_t a, b, a_scale, b_scale, out, offs;
  int64_t m, n, k, experts, lda, ldb, ldo, out_es, a_scale_ld, b_scale_ld;
  int accumulate;
  int out_kind;  // OutKind: kOutFP32, or kOutBF16 (no accumulate)
  uintptr_t stream;
};

// Why a weight-gradient call (WgradArgs or KGroupedWgradArgs) cannot run on any arch's kernels, or null: the rules
// every arch's entry checks before it reads anything else.
template <class Args>
inline const char* wgrad_args_refusal(const Args& a) {
  constexpr int64_t kLimit = int64_t(1) << 31;
  if (a.m < 1 || a.n < 16 || a.n % 16 || a.k < 128 || a.k % 128 || a.m >= kLimit || a.n >= kLimit || a.k >= kLimit)
    return "m >= 1, n a positive multiple of 16 and k of 128, each below 2^31, are required";
  if (a.out_kind != kOutFP32 && (a.out_kind != kOutBF16 || a.accumulate))
    return "out_kind must be fp32, or bf16 without accumulate";
  return nullptr;
}

// What crosses from Python: the header, then the arguments (fp8gemm/protocol.py mirrors each struct).
template <class Args>
struct Wire {
  uint32_t version;  // kProtocolVersion
  uint32_t size;     // sizeof(Wire<Args>)
  Args args;
};

// The sizes the Python mirrors (fp8gemm/protocol.py) compute; a field added on one side only fails the build or
// the core's check at load.
static_assert(sizeof(Wire<LaunchArgs>) == 136 && offsetof(LaunchArgs, stream) == 120, "mirror: LAUNCH_ARGS");
static_assert(sizeof(Wire<QuantizeArgs>) == 80 && offsetof(QuantizeArgs, stream) == 64, "mirror: QUANTIZE_ARGS");
static_assert(sizeof(Wire<LinearArgs>) == 128 && offsetof(LinearArgs, stream) == 112, "mirror: LINEAR_ARGS");
static_assert(sizeof(Wire<GroupedArgs>) == 200 && offsetof(GroupedArgs, stream) == 184, "mirror: GROUPED_ARGS");
static_assert(sizeof(Wire<MoeRouteArgs>) == 136 && offsetof(MoeRouteArgs, stream) == 120, "mirror: MOE_ROUTE_ARGS");
static_assert(sizeof(Wire<MoeActivationArgs>) == 96 && offsetof(MoeActivationArgs, stream) == 80,
              "mirror: MOE_ACTIVATION_ARGS");
static_assert(sizeof(Wire<MoeCombineArgs>) == 112 && offsetof(MoeCombineArgs, stream) == 96, "mirror: MOE_COMBINE_ARGS");
static_assert(sizeof(Wire<WgradArgs>) == 136 && offsetof(WgradArgs, stream) == 120, "mirror: WGRAD_ARGS");
static_assert(sizeof(Wire<QuantizeTransposedArgs>) == 144 && offsetof(QuantizeTransposedArgs, stream) == 128,
              "mirror: QUANTIZE_TRANSPOSED_ARGS");
static_assert(sizeof(Wire<QuantizeGroupedTransposedArgs>) == 192 && offsetof(QuantizeGroupedTransposedArgs, stream) == 176,
              "mirror: QUANTIZE_GROUPED_TRANSPOSED_ARGS");
static_assert(sizeof(Wire<KGroupedWgradArgs>) == 152 && offsetof(KGroupedWgradArgs, stream) == 136,
              "mirror: KGROUPED_WGRAD_ARGS");

}  // namespace fp8gemm
