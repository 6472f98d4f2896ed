// The mixture-of-experts step kernels every arch shares (docs/moe.md, "Steps"): the glue around the two grouped
// GEMMs of fp8gemm.fused_experts' pipeline, as portable C++ for CUDA, HIP and the host; each step's entry and argument
// struct are backend.hpp's.
//
//   route + quantize-scatter (moe_route, MoeRouteParams): topk_ids [T, k] -> offs int32 [E] (cumulative row ends),
//     position int32 [T, k] (each slot's row in expert order, stable: within an expert in flat slot order t * k + j;
//     -1 for an id outside [0, E)), then each token's x row quantized once into its k rows (codes and scales of
//     quantize_rows.cuh) by a scatter launch over every (token, K block). Slots are taken in chunks of whole tokens; with more than one
//     chunk a count launch first writes each chunk's per-expert counts to the workspace (no atomics: the same rows on
//     every run).
//   SiLU-and-mul + quantize (moe_activation, MoeActivationParams): h fp32 [rows, 2I] -> silu(gate) * up quantized,
//     rows >= offs[E-1] skipped.
//   combine (moe_combine, MoeCombineParams): out[t] = sum_j w[t, j] * y[position[t, j]] in fp32, j in order, -1 skipped.
//
// The arch's `Arch` struct is quantize_rows.cuh's (kFp8Max, group_max, load8, store8) plus
//   static FP8GEMM_QFN void barrier();      // every thread of the block, shared memory visible after it
//   static FP8GEMM_QFN float exp(float v);  // the expf torch's silu uses on that platform
// and a block is kMoeThreads threads (16-lane groups as in quantize_rows.cuh).
#pragma once
#include <stdint.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/quantize_rows.cuh"

#if defined(__CUDACC__) || defined(__HIP__)
#define FP8GEMM_MOE_HDFN __host__ __device__ inline  // sizes both the launcher and the kernels compute
#else
#define FP8GEMM_MOE_HDFN inline
#endif

namespace fp8gemm {

constexpr int kMoeThreads = 256;                      // threads per block of every step
constexpr int kMoeMaxExperts = 4 * kMoeThreads;       // E: each thread scans 4 experts' counts
constexpr int kMoeChunkSlots = 1024;                  // slots of one route block (whole tokens: k <= 1024)
constexpr int kMoeGroups = kMoeThreads / kQuantLanes;  // 16-lane groups per block

// The kernels' view of each step's arguments (backend.hpp), made on the host by the functions below.
struct MoeRouteParams {  // the count, route and scatter launches of moe_route
  const uint8_t* ids;  // int32 or int64 [tokens, top_k]
  const uint8_t* x;    // rows ldx_bytes apart
  uint8_t* q;          // FP8 [tokens * top_k, hidden], contiguous
  float* scale;        // MN-major: scale[kb * scale_ld + row]
  int32_t* offs;       // [experts]
  int32_t* position;   // [tokens, top_k]
  int32_t* hist;       // workspace: int32 [chunks, experts]
  int64_t tokens, top_k, experts, hidden, ldx_bytes, scale_ld;
  int64_t chunk_tokens, chunks;  // tokens per route block, blocks
  int id_kind, in_kind, pow2;
};

struct MoeActivationParams {
  const uint8_t* h;      // fp32 [rows, 2 inter], rows ldh_bytes apart
  uint8_t* q;            // FP8 [rows, inter], contiguous
  float* scale;          // MN-major: scale[kb * scale_ld + row]
  const int32_t* offs;   // [experts]: offs[experts - 1] rows to compute
  int64_t experts, inter, rows, ldh_bytes, scale_ld;
  int pow2;
};

struct MoeCombineParams {
  const uint8_t* weights;   // bf16/fp16/fp32 [tokens, top_k]
  const int32_t* position;  // [tokens, top_k]
  const uint8_t* y;         // bf16/fp32 [rows, hidden], rows ldy_bytes apart
  uint8_t* out;             // [tokens, hidden] out_kind, rows ldo_bytes apart
  int64_t tokens, top_k, hidden, rows, ldy_bytes, ldo_bytes;
  int out_kind, weight_kind, y_kind;
  int combine_cols, combine_blocks;  // columns per item (moe_combine_cols), blocks per token
};

FP8GEMM_MOE_HDFN int64_t moe_in_bytes(int kind) { return kind == kInFP32 ? 4 : 2; }

// Columns per combine item: 4 up to kMoeCombineNarrowTokens tokens, else 8. A decode step's combine starts after the
// GEMMs with a cold instruction cache, where a body of 8 columns spent most of its time fetching instructions; at many
// tokens the wider body moves the same bytes with fewer instructions (docs/decisions.md).
constexpr int64_t kMoeCombineNarrowTokens = 1024;
FP8GEMM_MOE_HDFN int moe_combine_cols(int64_t tokens) { return tokens <= kMoeCombineNarrowTokens ? 4 : 8; }
FP8GEMM_MOE_HDFN int64_t moe_combine_blocks(int64_t tokens, int64_t hidden) {  // per token
  return (hidden / moe_combine_cols(tokens) + kMoeThreads - 1) / kMoeThreads;
}

// Route blocks: whole tokens of at most kMoeChunkSlots slots each.
FP8GEMM_MOE_HDFN int64_t moe_chunk_tokens(int64_t top_k) { return top_k >= kMoeChunkSlots ? 1 : kMoeChunkSlots / top_k; }

FP8GEMM_MOE_HDFN int64_t moe_chunks(int64_t tokens, int64_t top_k) {
  const int64_t per = moe_chunk_tokens(top_k);
  return (tokens + per - 1) / per;
}

// The workspace the route step needs: per-chunk counts, none for a single chunk (decode).
FP8GEMM_MOE_HDFN int64_t moe_route_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  const int64_t chunks = moe_chunks(tokens, top_k);
  return chunks > 1 ? chunks * experts * 4 : 0;
}

inline MoeRouteParams moe_route_params(const MoeRouteArgs& a) {  // host side
  MoeRouteParams p{};
  p.ids = reinterpret_cast<const uint8_t*>(a.ids);
  p.x = reinterpret_cast<const uint8_t*>(a.x);
  p.q = reinterpret_cast<uint8_t*>(a.q);
  p.scale = reinterpret_cast<float*>(a.scale);
  p.offs = reinterpret_cast<int32_t*>(a.offs);
  p.position = reinterpret_cast<int32_t*>(a.position);
  p.hist = reinterpret_cast<int32_t*>(a.workspace);
  p.tokens = a.tokens, p.top_k = a.top_k, p.experts = a.experts, p.hidden = a.hidden;
  p.ldx_bytes = a.ldx * moe_in_bytes(a.in_kind);
  p.scale_ld = a.scale_ld;
  p.chunk_tokens = moe_chunk_tokens(a.top_k > 0 ? a.top_k : 1);
  p.chunks = a.top_k > 0 ? moe_chunks(a.tokens, a.top_k) : 0;
  p.id_kind = a.id_kind, p.in_kind = a.in_kind, p.pow2 = a.pow2;
  return p;
}

inline MoeActivationParams moe_activation_params(const MoeActivationArgs& a) {  // host side
  MoeActivationParams p{};
  p.h = reinterpret_cast<const uint8_t*>(a.h);
  p.q = reinterpret_cast<uint8_t*>(a.q);
  p.scale = reinterpret_cast<float*>(a.scale);
  p.offs = reinterpret_cast<const int32_t*>(a.offs);
  p.experts = a.experts, p.inter = a.inter, p.rows = a.rows;
  p.ldh_bytes = a.ldh * 4;
  p.scale_ld = a.scale_ld;
  p.pow2 = a.pow2;
  return p;
}

inline MoeCombineParams moe_combine_params(const MoeCombineArgs& a) {  // host side
  MoeCombineParams p{};
  p.weights = reinterpret_cast<const uint8_t*>(a.weights);
  p.position = reinterpret_cast<const int32_t*>(a.position);
  p.y = reinterpret_cast<const uint8_t*>(a.y);
  p.out = reinterpret_cast<uint8_t*>(a.out);
  p.tokens = a.tokens, p.top_k = a.top_k, p.hidden = a.hidden, p.rows = a.rows;
  p.ldy_bytes = a.ldy * (a.y_kind == kOutFP32 ? 4 : 2);
  p.ldo_bytes = a.ldo * moe_in_bytes(a.out_kind);
  p.out_kind = a.out_kind, p.weight_kind = a.weight_kind, p.y_kind = a.y_kind;
  p.combine_cols = moe_combine_cols(a.tokens);
  p.combine_blocks = static_cast<int>(moe_combine_blocks(a.tokens, a.hidden));
  return p;
}

// --- small conversions, integer arithmetic (the same bits on every target) ------------------------------------

FP8GEMM_QFN float half_float(uint32_t h) {  // IEEE binary16 bits -> float, exact
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  const float sub = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
  return sign ? -sub : sub;
}

FP8GEMM_QFN uint16_t float_bf16(float f) {  // round to nearest even; NaN stays NaN, as torch's .to(bfloat16)
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

FP8GEMM_QFN uint16_t float_half(float f) {  // round to nearest even, overflow to infinity, as torch's .to(float16)
  const uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // c10::Half's NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (a >= 0x38800000u) {  // normal: keep 10 of 23 mantissa bits, ties to even
    const uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) >> 13;
    return static_cast<uint16_t>(sign | (r - (112u << 10)));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // at most half the smallest subnormal
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(a >> 23);  // to a multiple of 2^-24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | q);
}

template <class Arch>
FP8GEMM_QFN void load8_kind(const uint8_t* p, int kind, float (&v)[8]) {
  if (kind == kInFP32) {
    Arch::template load8<kInFP32>(p, v);
  } else if (kind == kInFP16) {
    Arch::template load8<kInFP16>(p, v);
  } else {
    Arch::template load8<kInBF16>(p, v);
  }
}

// The scale of a 128-block from one lane's 8 values, as quantize_group computes it (all 16 lanes of the group call it).
template <class Arch>
FP8GEMM_QFN float block_scale_of(const float (&v)[8], bool pow2) {
  float amax = 0.f;
  for (int i = 0; i < kQuantElems; ++i) amax = nan_max(amax, v[i] < 0.f ? -v[i] : v[i]);
  return block_scale(Arch::group_max(amax), Arch::kFp8Max, pow2);
}

// --- route + quantize-scatter -----------------------------------------------------------------------------------

struct MoeRouteShared {
  int32_t ids[kMoeChunkSlots];  // the chunk's expert ids, experts for one outside [0, E)
  int32_t count[kMoeMaxExperts];  // this chunk's slots per expert, then all chunks' (route)
  int32_t start[kMoeMaxExperts];  // where each expert's rows start, then this chunk's first row of it
  int32_t scan[2][kMoeThreads];
};

FP8GEMM_QFN int32_t moe_expert(const MoeRouteParams& p, int64_t slot) {  // ids outside [0, E) become E
  const int64_t id = p.id_kind == 1 ? reinterpret_cast<const int64_t*>(p.ids)[slot]
                                    : static_cast<int64_t>(reinterpret_cast<const int32_t*>(p.ids)[slot]);
  return (id >= 0 && id < p.experts) ? static_cast<int32_t>(id) : static_cast<int32_t>(p.experts);
}

// Loads the chunk's ids into shared memory; returns its slot count.
template <class Arch>
FP8GEMM_QFN int moe_load_chunk(const MoeRouteParams& p, int64_t chunk, int tid, MoeRouteShared& s) {
  const int64_t first = chunk * p.chunk_tokens * p.top_k, slots = p.tokens * p.top_k;
  const int n = static_cast<int>(slots - first < p.chunk_tokens * p.top_k ? slots - first : p.chunk_tokens * p.top_k);
  for (int i = tid; i < n; i += kMoeThreads) s.ids[i] = moe_expert(p, first + i);
  Arch::barrier();
  return n;
}

FP8GEMM_QFN int32_t moe_count(const MoeRouteShared& s, int n, int32_t e) {
  int32_t c = 0;
  for (int i = 0; i < n; ++i) c += s.ids[i] == e;
  return c;
}

// The count launch (more than one chunk): hist[chunk][e] = the chunk's slots on expert e.
template <class Arch>
FP8GEMM_QFN void moe_count_chunk(const MoeRouteParams& p, int64_t chunk, int tid, MoeRouteShared& s) {
  const int n = moe_load_chunk<Arch>(p, chunk, tid, s);
  for (int e = tid; e < p.experts; e += kMoeThreads) p.hist[chunk * p.experts + e] = moe_count(s, n, e);
}

// s.start[e] = sum of s.count[e'] for e' < e (E <= kMoeMaxExperts: 4 consecutive experts per thread).
template <class Arch>
FP8GEMM_QFN void moe_exclusive_scan(const MoeRouteParams& p, int tid, MoeRouteShared& s) {
  int32_t local[4], sum = 0;
  for (int i = 0; i < 4; ++i) {
    const int e = 4 * tid + i;
    local[i] = sum;
    sum += e < p.experts ? s.count[e] : 0;
  }
  s.scan[0][tid] = sum;
  Arch::barrier();
  int src = 0;
  for (int offset = 1; offset < kMoeThreads; offset *= 2) {  // Hillis-Steele over the threads' sums
    s.scan[src ^ 1][tid] = s.scan[src][tid] + (tid >= offset ? s.scan[src][tid - offset] : 0);
    src ^= 1;
    Arch::barrier();
  }
  const int32_t before = s.scan[src][tid] - sum;
  for (int i = 0; i < 4; ++i)
    if (4 * tid + i < p.experts) s.start[4 * tid + i] = before + local[i];
  Arch::barrier();
}

// The route launch, one block per chunk: offs (block 0) and the chunk's positions.
template <class Arch>
FP8GEMM_QFN void moe_route_chunk(const MoeRouteParams& p, int64_t chunk, int tid, MoeRouteShared& s) {
  const int n = moe_load_chunk<Arch>(p, chunk, tid, s);
  int32_t earlier[4] = {0, 0, 0, 0};  // this chunk's first row within each of the thread's experts
  for (int i = 0; i < 4; ++i) {
    const int e = tid + i * kMoeThreads;
    if (e >= p.experts) continue;
    if (p.chunks == 1) {
      s.count[e] = moe_count(s, n, e);
    } else {
      int32_t total = 0;
      for (int64_t c = 0; c < p.chunks; ++c) {
        const int32_t h = p.hist[c * p.experts + e];
        total += h;
        earlier[i] += c < chunk ? h : 0;
      }
      s.count[e] = total;
    }
  }
  Arch::barrier();
  moe_exclusive_scan<Arch>(p, tid, s);
  for (int i = 0; i < 4; ++i) {
    const int e = tid + i * kMoeThreads;
    if (e >= p.experts) continue;
    if (chunk == 0) p.offs[e] = s.start[e] + s.count[e];
    s.start[e] += earlier[i];
  }
  Arch::barrier();
  const int64_t first = chunk * p.chunk_tokens * p.top_k;
  for (int i = tid; i < n; i += kMoeThreads) {  // rank: same-expert slots earlier in the chunk
    const int32_t e = s.ids[i];
    int32_t rank = 0;
    for (int j = 0; j < i; ++j) rank += s.ids[j] == e;
    p.position[first + i] = e < p.experts ? s.start[e] + rank : -1;
  }
}

// The scatter launch: (token, K block) items, kMoeGroups per block, spread over the GPU (one route block per chunk
// quantizing its own tokens ran a decode step's 64 x 7168 inputs on one SM: 0.36 ms).
FP8GEMM_MOE_HDFN int64_t moe_scatter_blocks(int64_t tokens, int64_t hidden) {
  return (tokens * (hidden / kQuantBlock) + kMoeGroups - 1) / kMoeGroups;
}

// One lane's share of item (token t, K block kb): the block quantized once, its codes and scale into each of the
// token's rows. All 16 lanes of a group call it (group_max).
template <class Arch>
FP8GEMM_QFN void moe_scatter_group(const MoeRouteParams& p, int64_t item, int lane) {
  const int64_t kbs = p.hidden / kQuantBlock, t = item / kbs, kb = item % kbs;
  const int64_t col = kb * kQuantBlock + lane * kQuantElems;
  float v[kQuantElems];
  load8_kind<Arch>(p.x + t * p.ldx_bytes + col * moe_in_bytes(p.in_kind), p.in_kind, v);
  const float scale = block_scale_of<Arch>(v, p.pow2 != 0);
  const float inv = 1.0f / scale;
  for (int i = 0; i < kQuantElems; ++i) v[i] *= inv;
  for (int64_t j = 0; j < p.top_k; ++j) {  // the same codes into each of the token's rows
    const int32_t row = p.position[t * p.top_k + j];
    if (row < 0) continue;
    Arch::store8(p.q + row * p.hidden + col, v);
    if (lane == 0) p.scale[kb * p.scale_ld + row] = scale;
  }
}

// --- SiLU and mul, quantize ------------------------------------------------------------------------------------

// Rows the activation step computes: the experts' rows (offs[E-1], read on the device), within [0, rows].
FP8GEMM_QFN int64_t moe_active_rows(const MoeActivationParams& p) {
  const int64_t end = p.offs[p.experts - 1];
  return end < 0 ? 0 : (end > p.rows ? p.rows : end);
}

// One lane's share of block (row, kb): silu(gate) * up as torch computes it in fp32, then quantize_group's numerics.
template <class Arch>
FP8GEMM_QFN void moe_activation_group(const MoeActivationParams& p, int64_t row, int64_t kb, int lane) {
  const int64_t col = kb * kQuantBlock + lane * kQuantElems;
  const uint8_t* h = p.h + row * p.ldh_bytes;
  float v[kQuantElems], up[kQuantElems];
  Arch::template load8<kInFP32>(h + col * 4, v);
  Arch::template load8<kInFP32>(h + (p.inter + col) * 4, up);
  for (int i = 0; i < kQuantElems; ++i) {
    v[i] = silu<Arch>(v[i]) * up[i];
  }
  const float scale = block_scale_of<Arch>(v, p.pow2 != 0);
  const float inv = 1.0f / scale;
  for (int i = 0; i < kQuantElems; ++i) v[i] *= inv;
  Arch::store8(p.q + row * p.inter + col, v);
  if (lane == 0) p.scale[kb * p.scale_ld + row] = scale;
}

// --- combine -----------------------------------------------------------------------------------------------------

constexpr int kMoeCombineBatch = 8;  // slots whose positions, weights and rows one item loads together (k <= 8: all)

template <int kWords>
struct alignas(kWords >= 4 ? 16 : 4 * kWords) MoeRaw {  // kWords 32-bit words, loaded and stored together
  uint32_t w[kWords];
};

template <int kKind>
FP8GEMM_QFN float load_float_of(const uint8_t* base, int64_t i) {  // one element of kind kKind (an InKind)
  if constexpr (kKind == kInFP32) return reinterpret_cast<const float*>(base)[i];
  const uint32_t bits = reinterpret_cast<const uint16_t*>(base)[i];
  return kKind == kInBF16 ? bits_float(bits << 16) : half_float(bits);
}

// moe_combine_item for one (out, y, weight) kind, no kind looked up in the loop: a batch's positions, then its rows and
// weights, loaded ahead of the sums and unconditionally (a slot that selects nothing reads row 0 and the token's last
// weight, and adds nothing), so the compiled code issues the rows' loads together.
template <int kCols, int kOut, int kY, int kWeight>
FP8GEMM_QFN void moe_combine_kinds(const MoeCombineParams& p, int64_t t, int64_t col) {
  constexpr int kYWords = kY == kOutFP32 ? kCols : kCols / 2;
  constexpr int kOutWords = kOut == kInFP32 ? kCols : kCols / 2;
  // 32-bit indices where they fit (rows < 2^31, a row's bytes < 2^32): fewer instructions to fetch.
  const int k = static_cast<int>(p.top_k);
  const uint32_t rows = static_cast<uint32_t>(p.rows), ldy = static_cast<uint32_t>(p.ldy_bytes);
  const int32_t* position = p.position + t * k;
  const uint8_t* y = p.y + col * (kY == kOutFP32 ? 4 : 2);
  const uint8_t* weights = p.weights + t * k * (kWeight == kInFP32 ? 4 : 2);
  float acc[kCols] = {};
  for (int j0 = 0; j0 < k; j0 += kMoeCombineBatch) {
    bool take[kMoeCombineBatch];  // false: a slot that selects nothing (-1 or past y's rows)
    uint32_t row[kMoeCombineBatch];
    for (int b = 0; b < kMoeCombineBatch; ++b) {
      const uint32_t r = j0 + b < k ? static_cast<uint32_t>(position[j0 + b]) : rows;
      take[b] = r < rows;
      row[b] = take[b] ? r : 0;
    }
    float w[kMoeCombineBatch];
    MoeRaw<kYWords> v[kMoeCombineBatch];
    for (int b = 0; b < kMoeCombineBatch; ++b) {
      w[b] = load_float_of<kWeight>(weights, j0 + b < k ? j0 + b : k - 1);
      v[b] = *reinterpret_cast<const MoeRaw<kYWords>*>(y + static_cast<uint64_t>(row[b]) * ldy);
    }
    for (int b = 0; b < kMoeCombineBatch; ++b) {
      if (!take[b]) continue;
      for (int i = 0; i < kCols; ++i) {
        const uint32_t word = v[b].w[kY == kOutFP32 ? i : i / 2];
        const uint32_t bits = kY == kOutFP32 ? word : (i % 2 ? word & 0xffff0000u : word << 16);
        acc[i] = __builtin_fmaf(w[b], bits_float(bits), acc[i]);
      }
    }
  }
  MoeRaw<kOutWords> out;
  for (int i = 0; i < kOutWords; ++i) {
    if constexpr (kOut == kInFP32) {
      out.w[i] = float_bits(acc[i]);
    } else {
      const uint32_t lo = kOut == kInBF16 ? float_bf16(acc[2 * i]) : float_half(acc[2 * i]);
      const uint32_t hi = kOut == kInBF16 ? float_bf16(acc[2 * i + 1]) : float_half(acc[2 * i + 1]);
      out.w[i] = lo | (hi << 16);
    }
  }
  *reinterpret_cast<MoeRaw<kOutWords>*>(p.out + t * p.ldo_bytes + col * (kOut == kInFP32 ? 4 : 2)) = out;
}

template <int kCols, int kOut, int kY>
FP8GEMM_QFN void moe_combine_weight_kind(const MoeCombineParams& p, int64_t t, int64_t col) {
  if (p.weight_kind == kInFP32) moe_combine_kinds<kCols, kOut, kY, kInFP32>(p, t, col);
  else if (p.weight_kind == kInBF16) moe_combine_kinds<kCols, kOut, kY, kInBF16>(p, t, col);
  else moe_combine_kinds<kCols, kOut, kY, kInFP16>(p, t, col);
}

template <int kCols, int kOut>
FP8GEMM_QFN void moe_combine_y_kind(const MoeCombineParams& p, int64_t t, int64_t col) {
  if (p.y_kind == kOutFP32) moe_combine_weight_kind<kCols, kOut, kOutFP32>(p, t, col);
  else moe_combine_weight_kind<kCols, kOut, kOutBF16>(p, t, col);
}

// Columns [col, col + kCols) of token t: sum over j in order of w[t, j] * y[position[t, j]] (fused multiply-adds in
// fp32). A kernel of one body (CUDA's) has fewer instructions to fetch than one that picks it at run time.
template <int kCols>
FP8GEMM_QFN void moe_combine_body(const MoeCombineParams& p, int64_t t, int64_t col) {
  if (p.out_kind == kInFP32) moe_combine_y_kind<kCols, kInFP32>(p, t, col);
  else if (p.out_kind == kInBF16) moe_combine_y_kind<kCols, kInBF16>(p, t, col);
  else moe_combine_y_kind<kCols, kInFP16>(p, t, col);
}

// Columns [col, col + p.combine_cols) of token t, the body picked at run time.
FP8GEMM_QFN void moe_combine_item(const MoeCombineParams& p, int64_t t, int64_t col) {
  if (p.combine_cols == 4) moe_combine_body<4>(p, t, col);
  else moe_combine_body<8>(p, t, col);
}

}  // namespace fp8gemm
