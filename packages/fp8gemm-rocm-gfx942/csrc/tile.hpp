// The workgroup tile both GEMM kernels share (kernels.hip: one GEMM; grouped.hip: one per expert): a BM x 128
// block of out over a range of K blocks, with the MFMA main loop, both scales, and a row/column-masked store.
//
// A workgroup (4 wavefronts) computes a BM x 128 tile; each wavefront owns TM x TN MFMA tiles of
// 32 x 32. K advances in 64-byte chunks through two LDS buffers: chunk c + 1 is fetched from global
// memory into registers while chunk c is multiplied, then written to the other buffer, so one
// barrier per chunk suffices. After every second chunk (one 128-wide scale block) the MFMA partial
// is promoted into the fp32 total with both scales: one B scale per tile (its 128x128 block), or with kColumns (the
// weight-gradient kernel, kernels.hip) one per column (1 x 128 along K, "1D1D"), staged in LDS like A's row scales. Rows past the tile's row end and columns past N
// are zero-filled on load and masked on store.
#pragma once
#include "heuristics.hpp"
#include "hip_compat.hpp"

namespace fp8gemm_gfx942 {

typedef float floatx16 __attribute__((ext_vector_type(16)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));

constexpr int kChunkK = 64;  // bytes of K per LDS buffer
constexpr int kLdsRow = 80;  // 64 bytes + 16 of padding: rows land on distinct banks, 16-byte aligned
constexpr int kWaveSize = 64;

template <int WM_, int WN_, int TM_, int TN_>
struct Cfg {
  static constexpr int WM = WM_, WN = WN_, TM = TM_, TN = TN_;
  static_assert(WM * WN * kWaveSize == kThreads, "4 wavefronts per workgroup");
  static_assert(WN * TN * 32 == kBlockN, "the tile is 128 wide (one b_scale block)");
  static constexpr int kBlockM = WM * TM * 32;
  static constexpr int kAVecs = kBlockM * kChunkK / 16;  // 16-byte vectors per chunk of A
  static constexpr int kBVecs = kBlockN * kChunkK / 16;
  static constexpr int kAPerThread = (kAVecs + kThreads - 1) / kThreads;
  static constexpr int kBPerThread = kBVecs / kThreads;
};

// The two tile shapes: 2 x 2 wavefronts of 2 x 2 MFMA tiles (128 x 128); 1 x 4 wavefronts of 1 x 1 (32 x 128).
using Cfg128 = Cfg<2, 2, 2, 2>;
using Cfg32 = Cfg<1, 4, 1, 1>;

// LDS of one workgroup: two chunk buffers of A and B, two K blocks of A row scales (and with kColumns of B column
// scales).
template <class C, bool kColumns = false>
struct TileLds {
  __attribute__((aligned(16))) uint8_t a[2][C::kBlockM * kLdsRow];
  __attribute__((aligned(16))) uint8_t b[2][kBlockN * kLdsRow];
  __attribute__((aligned(16))) float scale[2][C::kBlockM];
};
template <class C>
struct TileLds<C, true> : TileLds<C, false> {
  __attribute__((aligned(16))) float col_scale[2][kBlockN];
};

// The fp32 result of one wavefront: its TM x TN MFMA tiles.
template <class C>
struct TileAcc {
  floatx16 v[C::TM][C::TN];
};

// What one tile reads: rows [row0, row0 + BM) of A, valid below row_end; columns [n0, n0 + 128) of B, valid
// below n; K blocks [kb_begin, kb_begin + kb_count).
struct TileArgs {
  const uint8_t* a;          // [rows, k] FP8, row stride lda (bytes)
  const uint8_t* b;          // [n, k] FP8, row stride ldb
  const float* a_scale;      // MN-major: a_scale[kb * sa_ld + row]
  const float* b_scale_row;  // this tile's 128 columns: b_scale_row[kb]
  const float* b_scale_cols;  // kColumns: per column, MN-major: b_scale_cols[kb * sb_ld + column]
  int64_t lda, ldb, sa_ld, sb_ld;
  int row0, row_end, n0, n, kb_begin, kb_count;
};

__device__ inline int thread_id() { return __builtin_amdgcn_workitem_id_x(); }

__device__ inline void block_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

__device__ inline uint16_t to_bf16(float f) {  // round to nearest even; NaN stays NaN
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ inline u32x4 load16(const uint8_t* base, int64_t row, int64_t ld, int64_t col, bool in) {
  return in ? *reinterpret_cast<const u32x4*>(base + row * ld + col) : u32x4{0, 0, 0, 0};
}

// The tile's GEMM over its K blocks into acc (the promoted fp32 total). Every work-item of the workgroup calls it:
// it holds block_sync()s.
template <class C, bool kColumns = false>
__device__ inline void tile_mainloop(const TileArgs& t, TileLds<C, kColumns>& lds, TileAcc<C>& total) {
  constexpr int TM = C::TM, TN = C::TN;
  const int tid = thread_id(), lane = tid % kWaveSize, wave = tid / kWaveSize;
  const int wm = wave / C::WN, wn = wave % C::WN;
  const int chunks = 2 * t.kb_count;

  u32x4 ra[C::kAPerThread], rb[C::kBPerThread];
  float rs[4], rc[4];  // A row scales; B column scales (kColumns)
  auto fetch = [&](int c) {  // global -> registers for chunk c (and the A scales at a block start)
    const int64_t k_off = int64_t(t.kb_begin) * kBlockK + int64_t(c) * kChunkK;
#pragma unroll
    for (int i = 0; i < C::kAPerThread; ++i) {
      const int v = tid + i * kThreads, row = v / 4, col = (v % 4) * 16;
      ra[i] = load16(t.a, t.row0 + row, t.lda, k_off + col, v < C::kAVecs && t.row0 + row < t.row_end);
    }
#pragma unroll
    for (int i = 0; i < C::kBPerThread; ++i) {
      const int v = tid + i * kThreads, row = v / 4, col = (v % 4) * 16;
      rb[i] = load16(t.b, t.n0 + row, t.ldb, k_off + col, t.n0 + row < t.n);
    }
    if (c % 2 == 0 && tid < C::kBlockM / 4) {
      const float* col = t.a_scale + int64_t(t.kb_begin + c / 2) * t.sa_ld;
      const int r = t.row0 + 4 * tid;
#pragma unroll
      for (int j = 0; j < 4; ++j) rs[j] = r + j < t.row_end ? col[r + j] : 0.0f;
    }
    if (kColumns && c % 2 == 0 && tid < kBlockN / 4) {
      const float* row = t.b_scale_cols + int64_t(t.kb_begin + c / 2) * t.sb_ld;
      const int n = t.n0 + 4 * tid;
#pragma unroll
      for (int j = 0; j < 4; ++j) rc[j] = n + j < t.n ? row[n + j] : 0.0f;
    }
  };
  auto stash = [&](int c) {  // registers -> LDS buffer c % 2
#pragma unroll
    for (int i = 0; i < C::kAPerThread; ++i) {
      const int v = tid + i * kThreads;
      if (v < C::kAVecs) *reinterpret_cast<u32x4*>(&lds.a[c % 2][(v / 4) * kLdsRow + (v % 4) * 16]) = ra[i];
    }
#pragma unroll
    for (int i = 0; i < C::kBPerThread; ++i) {
      const int v = tid + i * kThreads;
      *reinterpret_cast<u32x4*>(&lds.b[c % 2][(v / 4) * kLdsRow + (v % 4) * 16]) = rb[i];
    }
    if (c % 2 == 0 && tid < C::kBlockM / 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) lds.scale[(c / 2) % 2][4 * tid + j] = rs[j];
    }
    if constexpr (kColumns) {
      if (c % 2 == 0 && tid < kBlockN / 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) lds.col_scale[(c / 2) % 2][4 * tid + j] = rc[j];
      }
    }
  };

  floatx16 acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) total.v[i][j] = acc[i][j] = floatx16{};

  // MFMA 32x32x16 operand layout: lane l supplies row (l % 32), K bytes 8 * (l / 32) .. + 7.
  const int frag_row = lane % 32, frag_k = 8 * (lane / 32);

  if (chunks > 0) {
    fetch(0);
    stash(0);
  }
  block_sync();
  for (int c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) fetch(c + 1);  // in flight while chunk c is multiplied
    const uint8_t* sa = lds.a[c % 2];
    const uint8_t* sb = lds.b[c % 2];
#pragma unroll
    for (int ks = 0; ks < kChunkK / 16; ++ks) {
      long af[TM], bf[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i)
        af[i] = *reinterpret_cast<const long*>(&sa[((wm * TM + i) * 32 + frag_row) * kLdsRow + ks * 16 + frag_k]);
#pragma unroll
      for (int j = 0; j < TN; ++j)
        bf[j] = *reinterpret_cast<const long*>(&sb[((wn * TN + j) * 32 + frag_row) * kLdsRow + ks * 16 + frag_k]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(af[i], bf[j], acc[i][j], 0, 0, 0);
    }
    if (c % 2 == 1) {  // end of a 128-wide scale block: promote
      const float* ascale = lds.scale[(c / 2) % 2];
      float bscale[kColumns ? TN : 1];  // this lane's column of each MFMA tile, or the tile's one scale
      if constexpr (kColumns) {
#pragma unroll
        for (int j = 0; j < TN; ++j) bscale[j] = lds.col_scale[(c / 2) % 2][(wn * TN + j) * 32 + lane % 32];
      } else {
        bscale[0] = t.b_scale_row[t.kb_begin + c / 2];
      }
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          // Output layout of MFMA 32x32: register r of lane l is row 8*(r/4) + 4*(l/32) + r%4, column l%32.
          const float sa = ascale[(wm * TM + i) * 32 + 8 * (r / 4) + 4 * (lane / 32) + r % 4];
#pragma unroll
          for (int j = 0; j < TN; ++j) total.v[i][j][r] += acc[i][j][r] * (sa * bscale[kColumns ? j : 0]);
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = floatx16{};
      }
    }
    if (c + 1 < chunks) stash(c + 1);  // the other buffer: last read before the previous barrier
    block_sync();
  }
}

// Hands each element of the tile inside rows [row0, row_end) and columns [n0, n) to store(row, col, value); the
// rest (another group's rows, the M and N tails) is never written.
template <class C, class Store>
__device__ inline void tile_store(const TileAcc<C>& total, int row0, int row_end, int n0, int n, Store store) {
  const int lane = thread_id() % kWaveSize, wave = thread_id() / kWaveSize;
  const int wm = wave / C::WN, wn = wave % C::WN;
#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
#pragma unroll
    for (int j = 0; j < C::TN; ++j) {
      const int col = n0 + (wn * C::TN + j) * 32 + lane % 32;
      if (col >= n) continue;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const int row = row0 + (wm * C::TM + i) * 32 + 8 * (r / 4) + 4 * (lane / 32) + r % 4;
        if (row >= row_end) continue;
        store(row, col, total.v[i][j][r]);
      }
    }
  }
}

// One output element as bf16 or fp32 into out[row * ldo + col].
__device__ inline void store_out(void* out, int64_t ldo, bool fp32, int64_t row, int64_t col, float x) {
  if (fp32)
    static_cast<float*>(out)[row * ldo + col] = x;
  else
    static_cast<uint16_t*>(out)[row * ldo + col] = to_bf16(x);
}

}  // namespace fp8gemm_gfx942
