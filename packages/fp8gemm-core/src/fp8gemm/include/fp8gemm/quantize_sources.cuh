// Fused row sources of the grouped transposing quantizer (fp8gemm/backend.hpp RowSourceKind): the rows it quantizes
// computed in fp32 from other tensors as it loads them, so the training experts' intermediates (gathered rows, SiLU-
// and-mul and its backward) are never written to memory. Each source's values are the torch composition's in fp32,
// operation for operation (fp8gemm.training's reference runs that composition):
//   gather:          x[index[r]] * row_weight[r]    (no product without row_weight; an index outside [0, source_rows)
//                                                   reads a zero row)
//   swiglu:          silu(g) * u                    g, u: x[r, c] and x[r, k + c], fp32
//   swiglu backward: c < k/2: silu'(g) * (d * u)    d: x[r, c'] fp32 [m, k/2], g, u: gate_up[r, c'] and
//                    c >= k/2: silu(g) * d          gate_up[r, k/2 + c'], c' = c mod k/2
// with silu(g) = g / (1 + exp(-g)) rounded, silu'(g) * t = t * s * (1 + g * (1 - s)), s = 1 / (1 + exp(-g)) (torch's
// silu_backward). A tile's columns lie in one half of the backward's (k/2 is a multiple of 128). The arch supplies,
// beyond quantize_tiles.cuh's Arch: static FP8GEMM_QFN float exp(float v), the expf its torch uses.
#pragma once
#include <stdint.h>

#include "fp8gemm/quantize_grouped_tiles.cuh"

namespace fp8gemm {

template <int kIn>
FP8GEMM_TILE_FN void load_values(const uint8_t* src, float (&v)[kQuantElems]) {
  unpack8<kIn>(*reinterpret_cast<const RawRow<kIn>*>(src), v);
}

// One thread's 8 values of row r from column col on: the source's fp32 values.
template <class Arch, int kSource, int kIn, int kGateIn>
FP8GEMM_TILE_FN void source_values(const QuantizeGroupedParams& p, int64_t r, int64_t col, float (&v)[kQuantElems]) {
  const QuantizeTransposedParams& t = p.tiles;
  const RowSource& s = p.source;
  if constexpr (kSource == kSourceGather) {
    const int64_t from = s.index[r];
    if (from < 0 || from >= s.source_rows) {
      for (float& e : v) e = 0.f;
      return;
    }
    load_values<kIn>(t.x + from * t.ldx_bytes + col * kInBytes<kIn>, v);
    if (s.row_weight) {
      const float w = s.row_weight[r];
      for (float& e : v) e *= w;
    }
  } else if constexpr (kSource == kSourceSwiglu) {
    float up[kQuantElems];
    load_values<kInFP32>(t.x + r * t.ldx_bytes + col * 4, v);
    load_values<kInFP32>(t.x + r * t.ldx_bytes + (t.k + col) * 4, up);
    for (int j = 0; j < kQuantElems; ++j) v[j] = silu<Arch>(v[j]) * up[j];
  } else {
    const int64_t half = t.k / 2, c = col < half ? col : col - half;
    const uint8_t* h = s.gate_up + r * s.ld_gate_up_bytes;
    float gate[kQuantElems];
    load_values<kInFP32>(t.x + r * t.ldx_bytes + c * 4, v);  // d
    load_values<kGateIn>(h + c * kInBytes<kGateIn>, gate);
    if (col < half) {
      float up[kQuantElems];
      load_values<kGateIn>(h + (half + c) * kInBytes<kGateIn>, up);
      for (int j = 0; j < kQuantElems; ++j) {
        const float dy = v[j] * up[j], x = gate[j];
        const float sig = 1.0f / (1.0f + Arch::exp(-x));
        v[j] = dy * sig * (1.0f + x * (1.0f - sig));
      }
    } else {
      for (int j = 0; j < kQuantElems; ++j) v[j] = silu<Arch>(gate[j]) * v[j];
    }
  }
}

// A thread's 8 rows of the tile of rows `rows` and k block kb, computed by the source (as fp32 bits; rows from `end`
// on as zeros), for quantize_loaded_rows<Arch, kInFP32>.
template <class Arch, int kSource, int kIn, int kGateIn>
FP8GEMM_TILE_FN void load_source_rows(const QuantizeGroupedParams& p, const TileRows& rows, int64_t kb, int tid,
                                      RawRow<kInFP32> (&raw)[kTileRowsPerThread]) {
  const int64_t row0 = rows.first + (tid / kQuantLanes) * kTileRowsPerThread;
  const int64_t col = kb * kQuantBlock + (tid % kQuantLanes) * kQuantElems;
  FP8GEMM_UNROLL_ROWS
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    float v[kQuantElems];
    if (row0 + i < rows.end) {
      source_values<Arch, kSource, kIn, kGateIn>(p, row0 + i, col, v);
    } else {
      for (float& e : v) e = 0.f;
    }
    for (int j = 0; j < kQuantElems; ++j) raw[i].w[j] = float_bits(v[j]);
  }
}

// One compiled instance of a source kernel: the source and its input kinds (kGateIn: the SwiGLU backward's h).
template <int kSource, int kIn, int kGateIn = kInFP32>
struct SourceInstance {
  static constexpr int source = kSource, in = kIn, gate_in = kGateIn;
};

// Host: calls visit(SourceInstance<...>{}) for the instance that runs `source` on these kinds and returns true, or
// returns false where none is compiled. Every arch builds this set: the gather from bf16/fp16/fp32 x, SwiGLU from fp32
// h, its backward from fp32 d and bf16/fp16/fp32 h.
template <class Visit>
inline bool visit_source_instance(int source, int in_kind, int gate_up_kind, Visit&& visit) {
  if (source == kSourceGather) {
    if (in_kind == kInBF16) return visit(SourceInstance<kSourceGather, kInBF16>{}), true;
    if (in_kind == kInFP16) return visit(SourceInstance<kSourceGather, kInFP16>{}), true;
    if (in_kind == kInFP32) return visit(SourceInstance<kSourceGather, kInFP32>{}), true;
  } else if (source == kSourceSwiglu && in_kind == kInFP32) {
    return visit(SourceInstance<kSourceSwiglu, kInFP32>{}), true;
  } else if (source == kSourceSwigluBackward && in_kind == kInFP32) {
    if (gate_up_kind == kInBF16) return visit(SourceInstance<kSourceSwigluBackward, kInFP32, kInBF16>{}), true;
    if (gate_up_kind == kInFP16) return visit(SourceInstance<kSourceSwigluBackward, kInFP32, kInFP16>{}), true;
    if (gate_up_kind == kInFP32) return visit(SourceInstance<kSourceSwigluBackward, kInFP32, kInFP32>{}), true;
  }
  return false;
}

// Column-block index `block` of the launch, K block kb, its rows computed by the source.
template <class Arch, int kSource, int kIn, int kGateIn>
FP8GEMM_QFN void quantize_grouped_source_tile(const QuantizeGroupedParams& p, int64_t block, int64_t kb, int tid,
                                              ExpertSearch& search, TransposeTile& tile) {
  const TileRows rows = grouped_tile_rows<Arch>(p, block, tid, search);
  if (!rows.transpose && rows.end <= rows.first) return;  // uniform: a leftover index past the last row
  RawRow<kInFP32> raw[kTileRowsPerThread];
  load_source_rows<Arch, kSource, kIn, kGateIn>(p, rows, kb, tid, raw);
  quantize_loaded_rows<Arch, kInFP32>(p.tiles, rows, kb, tid, tile, raw);
}

}  // namespace fp8gemm
