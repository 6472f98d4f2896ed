// Quantization with a transpose, the algorithm every arch shares (fp8gemm/backend.hpp QuantizeTransposedArgs): one
// workgroup reads one 128 x 128 tile of x [m, k] once and writes it in FP8 twice, as q [m, k] and as q_t [k, m_t],
// bit-identical to fp8gemm.training's reference (docs/training.md):
//   activations (blocks = 0): q with one scale per 1 x 128 along k (fp8gemm.quantize_activation's codes and scales),
//     q_t with one scale per 1 x 128 along m (x's 128 x 1 tiles); rows m..m_t-1 of x read as zeros;
//   weights (blocks = 1): one scale per 128 x 128 tile for both (fp8gemm.quantize_weight's), the codes transposed.
// Numerics as fp8gemm/quantize_rows.cuh (inputs widened exactly here, not by the Arch's load8). 256 threads: thread t
// reads columns 8 (t % 16) .. +7 of rows
// 8 (t / 16) .. +7, so a 16-lane group shares a row (the row maximum) and a thread owns 8 consecutive rows of each of
// its columns (8 transposed codes, one 8-byte store). The arch supplies, beyond quantize_rows.cuh's Arch:
//   static FP8GEMM_QFN void barrier();   // the workgroup barrier, shared memory visible after it
#pragma once
#include <stdint.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/quantize_rows.cuh"

// The two passes' row loops fully unrolled, so a thread's rows stay in registers (without it gfx942's clang keeps them
// in scratch memory); device compilers only, a host compiler may not know the pragma. The tile's body is inlined into
// each kernel that runs it (the dense and the grouped one): a call would put a thread's rows in scratch memory too.
#if defined(__CUDACC__) || defined(__HIP__)
#define FP8GEMM_UNROLL_ROWS _Pragma("unroll")
#define FP8GEMM_TILE_FN FP8GEMM_QFN __attribute__((always_inline))
#else
#define FP8GEMM_UNROLL_ROWS
#define FP8GEMM_TILE_FN FP8GEMM_QFN
#endif

namespace fp8gemm {

constexpr int kTileRowsPerThread = 8;

struct QuantizeTransposedParams {
  const uint8_t* x;  // bytes: rows are ldx_bytes apart
  uint8_t* q;        // [m, k] contiguous
  uint8_t* q_t;      // [k, m_t] contiguous, or m_t / q_t_group such matrices [k, q_t_group] one after another
  float* scale;      // (row or row block, k block) at row * scale_s0 + kb * scale_s1
  float* scale_t;    // (column, row block) or (k block, row block) at c * scale_t_s0 + rb * scale_t_s1
  int64_t m, k, m_t, ldx_bytes, scale_s0, scale_s1, scale_t_s0, scale_t_s1;
  int pow2, blocks;
  int64_t q_t_group;  // columns of one matrix of q_t: m_t for one matrix
};

inline QuantizeTransposedParams quantize_transposed_params(const QuantizeTransposedArgs& a) {
  return QuantizeTransposedParams{reinterpret_cast<const uint8_t*>(a.x), reinterpret_cast<uint8_t*>(a.q),
                                  reinterpret_cast<uint8_t*>(a.q_t), reinterpret_cast<float*>(a.scale),
                                  reinterpret_cast<float*>(a.scale_t), a.m, a.k, a.m_t,
                                  a.ldx * (a.in_kind == kInFP32 ? 4 : 2), a.scale_s0, a.scale_s1, a.scale_t_s0,
                                  a.scale_t_s1, a.pow2, a.blocks, a.q_t_group ? a.q_t_group : a.m_t};
}

// Host: whether q_t_group splits q_t into whole matrices of whole 128-column blocks (QuantizeTransposedArgs).
inline bool q_t_group_fits(const QuantizeTransposedArgs& a) {
  return a.q_t_group == 0 || (a.q_t_group > 0 && a.q_t_group % 128 == 0 && a.m_t % a.q_t_group == 0);
}

// Shared memory of one workgroup: per-thread-row partial maxima, then the codes of q_t with each 8-byte chunk of a
// 128-byte row stored at chunk index (chunk ^ (column / 8)) so the 16 lanes of a store hit distinct banks.
struct TransposeTile {
  float partial[kQuantThreads / kQuantLanes][kQuantBlock];
  float column_scale[kQuantBlock];
  uint64_t codes[kQuantBlock][kQuantBlock / 8];
};

FP8GEMM_QFN int swizzled_chunk(int column, int chunk) { return chunk ^ ((column >> 3) & 15); }

// One row's 8 inputs as loaded (16 bytes of bf16/fp16, 32 of fp32), kept so until used: half the registers of 8
// floats for 16-bit inputs, so more tiles are in flight, and the second pass needs no second read.
template <int kIn>
struct alignas(16) RawRow {
  uint32_t w[kIn == kInFP32 ? 8 : 4];
};

// fp16 bits -> float, exactly and without branches: the magnitude's bits moved into a float's places and scaled by
// 2^112 (the exponent biases' difference; subnormals too), infinities and NaNs kept as such.
FP8GEMM_QFN float half_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, magnitude = (h & 0x7fffu) << 13;
  const uint32_t finite = float_bits(bits_float(magnitude) * 0x1p112f);
  return bits_float(sign | ((h & 0x7c00u) == 0x7c00u ? magnitude | 0x7f800000u : finite));
}

template <int kIn>
FP8GEMM_QFN void unpack8(const RawRow<kIn>& r, float (&v)[kQuantElems]) {
  for (int i = 0; i < 4; ++i) {
    if constexpr (kIn == kInFP32) {
      v[2 * i] = bits_float(r.w[2 * i]), v[2 * i + 1] = bits_float(r.w[2 * i + 1]);
    } else if constexpr (kIn == kInBF16) {  // the first element in the low half (little-endian)
      v[2 * i] = bits_float(r.w[i] << 16), v[2 * i + 1] = bits_float(r.w[i] & 0xffff0000u);
    } else {
      v[2 * i] = half_to_float(r.w[i] & 0xffffu), v[2 * i + 1] = half_to_float(r.w[i] >> 16);
    }
  }
}

// __byte_perm: byte n of the result is byte (s >> 4n) & 7 of the pair (x: bytes 0-3, y: 4-7).
FP8GEMM_QFN uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t pair = (uint64_t(y) << 32) | x;
  uint32_t out = 0;
  for (int n = 0; n < 4; ++n) out |= uint32_t((pair >> (8 * ((s >> (4 * n)) & 7))) & 0xffu) << (8 * n);
  return out;
#endif
}

// An 8 x 8 byte matrix transposed: rows[h][i] holds row i's bytes 4h .. 4h + 3; columns[j] gets column j (byte i: row
// i). Each 4 x 4 quarter in two rounds of byte permutes (8 of them), where byte shifts took about 200 instructions.
FP8GEMM_QFN void transpose_8x8_bytes(const uint32_t (&rows)[2][kTileRowsPerThread], uint64_t (&columns)[kQuantElems]) {
  for (int h = 0; h < 2; ++h) {    // columns 4h .. 4h + 3
    uint32_t quarter[2][4];        // [rows 0-3 / 4-7][column]
    for (int r = 0; r < 2; ++r) {  // rows 4r .. 4r + 3
      const uint32_t* q = &rows[h][4 * r];
      const uint32_t t0 = byte_perm(q[0], q[1], 0x5140), t1 = byte_perm(q[0], q[1], 0x7362);
      const uint32_t t2 = byte_perm(q[2], q[3], 0x5140), t3 = byte_perm(q[2], q[3], 0x7362);
      quarter[r][0] = byte_perm(t0, t2, 0x5410), quarter[r][1] = byte_perm(t0, t2, 0x7632);
      quarter[r][2] = byte_perm(t1, t3, 0x5410), quarter[r][3] = byte_perm(t1, t3, 0x7632);
    }
    for (int c = 0; c < 4; ++c) columns[4 * h + c] = (uint64_t(quarter[1][c]) << 32) | quarter[0][c];
  }
}

// The rows one tile reads: x rows first .. first + 127 below `end` (the tile's other rows read as zeros), whose
// transpose is q_t's column block `block` (and scale_t's); `transpose` 0 writes q alone (rows of no expert).
struct TileRows {
  int64_t first, end, block;
  int transpose;
};

// A thread's 8 rows of the tile of rows `rows` and k block kb, as loaded (rows from `end` on as zeros: zero codes, no
// effect on a maximum). A CUDA arch may fill them another way (cp.async ahead of time, fp8gemm/cuda/quantize.cuh).
template <int kIn>
FP8GEMM_TILE_FN void load_tile_rows(const QuantizeTransposedParams& p, const TileRows& rows, int64_t kb, int tid,
                                    RawRow<kIn> (&raw)[kTileRowsPerThread]) {
  const int64_t row0 = rows.first + (tid / kQuantLanes) * kTileRowsPerThread;
  const uint8_t* src = p.x + row0 * p.ldx_bytes + (kb * kQuantBlock + (tid % kQuantLanes) * kQuantElems) * kInBytes<kIn>;
  FP8GEMM_UNROLL_ROWS
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    if (row0 + i < rows.end) {
      raw[i] = *reinterpret_cast<const RawRow<kIn>*>(src + i * p.ldx_bytes);
    } else {
      for (uint32_t& w : raw[i].w) w = 0;
    }
  }
}

// The tile of rows `rows` and k block kb from each thread's loaded rows. `tile` is the workgroup's shared TransposeTile.
// Two passes over the rows in registers: the first takes the maxima (and writes the activations' q), the second writes
// the codes scaled as the maxima decided.
template <class Arch, int kIn>
FP8GEMM_TILE_FN void quantize_loaded_rows(const QuantizeTransposedParams& p, const TileRows& rows, int64_t kb, int tid,
                                          TransposeTile& tile, const RawRow<kIn> (&raw)[kTileRowsPerThread]) {
  const int lane = tid % kQuantLanes, group = tid / kQuantLanes;
  const int64_t row0 = rows.first + group * kTileRowsPerThread, col = kb * kQuantBlock + lane * kQuantElems, rb = rows.block;
  float col_amax[kQuantElems];
  for (int j = 0; j < kQuantElems; ++j) col_amax[j] = 0.f;
  FP8GEMM_UNROLL_ROWS
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    float v[kQuantElems];
    unpack8<kIn>(raw[i], v);
    float r = 0.f;
    for (int j = 0; j < kQuantElems; ++j) {
      const float a = __builtin_fabsf(v[j]);
      col_amax[j] = nan_max(col_amax[j], a);
      r = nan_max(r, a);
    }
    if (!p.blocks) {  // q: 1 x 128 along k, as quantize_rows.cuh; the row maximum taken by every lane (converged)
      const float s = block_scale(Arch::group_max(r), Arch::kFp8Max, p.pow2 != 0);
      if (row0 + i < rows.end) {
        const float inv = 1.0f / s;
        for (int j = 0; j < kQuantElems; ++j) v[j] *= inv;
        Arch::store8(p.q + (row0 + i) * p.k + col, v);
        if (lane == 0) p.scale[(row0 + i) * p.scale_s0 + kb * p.scale_s1] = s;
      }
    }
  }
  if (!rows.transpose) return;  // uniform over the workgroup: q was its only output
  for (int j = 0; j < kQuantElems; ++j) tile.partial[group][lane * kQuantElems + j] = col_amax[j];
  Arch::barrier();
  if (tid < kQuantBlock) {  // each column's maximum over the tile's rows
    float a = 0.f;
    for (int g = 0; g < kQuantThreads / kQuantLanes; ++g) a = nan_max(a, tile.partial[g][tid]);
    if (p.blocks) {
      tile.column_scale[tid] = a;
    } else {  // q_t: 1 x 128 along m, one scale per column
      const float s = block_scale(a, Arch::kFp8Max, p.pow2 != 0);
      tile.column_scale[tid] = 1.0f / s;
      p.scale_t[(kb * kQuantBlock + tid) * p.scale_t_s0 + rb * p.scale_t_s1] = s;
    }
  }
  Arch::barrier();
  float inv[kQuantElems];
  if (p.blocks) {  // one scale for the tile, q and q_t sharing its codes
    float a = 0.f;
    for (int c = 0; c < kQuantBlock; ++c) a = nan_max(a, tile.column_scale[c]);
    const float s = block_scale(a, Arch::kFp8Max, p.pow2 != 0);
    for (int j = 0; j < kQuantElems; ++j) inv[j] = 1.0f / s;
    if (tid == 0) {
      p.scale[rb * p.scale_s0 + kb * p.scale_s1] = s;
      p.scale_t[kb * p.scale_t_s0 + rb * p.scale_t_s1] = s;
    }
  } else {
    for (int j = 0; j < kQuantElems; ++j) inv[j] = tile.column_scale[lane * kQuantElems + j];
  }
  uint32_t row_codes[2][kTileRowsPerThread];  // [columns 0-3 / 4-7][row]: the row's codes, as store8 writes them
  FP8GEMM_UNROLL_ROWS
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    float v[kQuantElems];
    unpack8<kIn>(raw[i], v);
    for (int j = 0; j < kQuantElems; ++j) v[j] *= inv[j];
    uint32_t codes[2];
    Arch::store8(reinterpret_cast<uint8_t*>(codes), v);
    row_codes[0][i] = codes[0], row_codes[1][i] = codes[1];
    if (p.blocks && row0 + i < rows.end)
      *reinterpret_cast<uint64_t*>(p.q + (row0 + i) * p.k + col) = (uint64_t(codes[1]) << 32) | codes[0];
  }
  uint64_t column_codes[kQuantElems];  // byte i: row row0 + i of column col + j
  transpose_8x8_bytes(row_codes, column_codes);
  for (int j = 0; j < kQuantElems; ++j) {
    const int c = lane * kQuantElems + j;
    tile.codes[c][swizzled_chunk(c, group)] = column_codes[j];
  }
  Arch::barrier();
  // q_t rows kb*128 .. +127, columns rb*128 .. +127 (those below m_t), 16 bytes a thread a step; the columns lie in
  // one matrix of q_t (q_t_group a multiple of 128)
  const int64_t col0 = rb * kQuantBlock, matrix = col0 / p.q_t_group;
  uint8_t* q_t = p.q_t + matrix * p.k * p.q_t_group + (col0 - matrix * p.q_t_group);
  for (int piece = tid; piece < kQuantBlock * 8; piece += kQuantThreads) {
    const int c = piece / 8, half = piece % 8;
    if (col0 + half * 16 >= p.m_t) continue;
    const uint64_t lo = tile.codes[c][swizzled_chunk(c, 2 * half)], hi = tile.codes[c][swizzled_chunk(c, 2 * half + 1)];
    uint64_t* dst = reinterpret_cast<uint64_t*>(q_t + (kb * kQuantBlock + c) * p.q_t_group + half * 16);
    dst[0] = lo;
    dst[1] = hi;
  }
}

// The tile of rows `rows` and k block kb, loaded and quantized.
template <class Arch, int kIn>
FP8GEMM_TILE_FN void quantize_tile_rows(const QuantizeTransposedParams& p, const TileRows& rows, int64_t kb, int tid,
                                        TransposeTile& tile) {
  RawRow<kIn> raw[kTileRowsPerThread];
  load_tile_rows<kIn>(p, rows, kb, tid, raw);
  quantize_loaded_rows<Arch, kIn>(p, rows, kb, tid, tile, raw);
}

// The dense tile (row block rb, k block kb): rows rb*128 .. +127 of x, those below m.
template <class Arch, int kIn>
FP8GEMM_QFN void quantize_transposed_tile(const QuantizeTransposedParams& p, int64_t rb, int64_t kb, int tid,
                                          TransposeTile& tile) {
  quantize_tile_rows<Arch, kIn>(p, TileRows{rb * kQuantBlock, p.m, rb, 1}, kb, tid, tile);
}

}  // namespace fp8gemm
