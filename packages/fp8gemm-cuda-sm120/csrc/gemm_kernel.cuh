// FP8 block-scaled GEMM with warp-level tensor-core MMA (mma.sync m16n8k32 e4m3, sm_89 and later).
//
// out[m, n] = sum_kb scale_a[m, kb] * scale_b[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// One block computes a kBlockM x 128 tile (tile_mainloop, tile_store: grouped_kernel.cuh runs them per expert,
// wgrad_kernel.cuh with a B scale per column). K advances 128 at a time (one scale block per pipeline
// stage): cp.async brings A, B and the A scales of stage s + STAGES - 1 while stage s is multiplied;
// the MMA accumulates a 128-deep partial in fp32, then it is "promoted" into the running total with
// both scales. Operand tiles in shared memory are XOR-swizzled by 16-byte chunk so that ldmatrix
// reads 8 rows of one logical chunk from 8 different banks groups.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp8gemm/gemm_params.hpp"
#include "heuristics.hpp"

namespace fp8gemm_sm120 {

using Params = fp8gemm::GemmParams;

// kColumnScales (the weight-gradient kernel, wgrad_kernel.cuh): each stage also holds the B scales of the tile's 128
// columns for its K block, one per column (1 x 128 along K on both operands).
template <int WARPS_M, int STAGES, bool kColumnScales = false>
struct Traits {
  static constexpr int kWarpsN = 4;
  static constexpr int kThreads = WARPS_M * kWarpsN * 32;
  static constexpr int kWarpTileM = 64, kWarpTileN = 32;
  static constexpr int kBlockM = WARPS_M * kWarpTileM;
  static constexpr int kMmaM = kWarpTileM / 16, kMmaN = kWarpTileN / 8;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kScaleBytes = kBlockM * 4;
  static constexpr int kColumnScaleBytes = kColumnScales ? kBlockN * 4 : 0;
  static constexpr int kStageBytes = kABytes + kBBytes + kScaleBytes + kColumnScaleBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(kSmemBytes <= 99 * 1024, "sm_120 allows at most 99 KB of shared memory per block");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; bytes past src_bytes are zero-filled (rows past M or N read nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// 4-byte async copy (zero-filled past src_bytes): A scales of a tile that starts at any row.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` (0..7) of tile row `row` (128 bytes per row).
__device__ __forceinline__ int swizzle(int row, int chunk) { return row * kBlockK + ((chunk ^ (row & 7)) << 4); }

// What a grouped tile reads (the dense kernel passes its Params, whose fields have the same names): A rows valid
// below m (indices into a, a_scale: the group's row end), B rows valid below n.
struct TileIn {
  const uint8_t* a;      // [rows, k] FP8, row stride lda (bytes)
  const uint8_t* b;      // [n, k] FP8, row stride ldb
  const float* a_scale;  // MN-major: a_scale[kb * sa_ld + row]
  int64_t lda, ldb, sa_ld;
  int m, n;
};

// kAlignedRows: the tile's first row is a multiple of 4 and the scale columns 16-byte aligned (the dense kernel),
// so its A scales move 16 bytes at a time; a grouped tile starts at any row and copies them 4 bytes at a time.
// kColumnScales: Src also has b_scale and sb_ld, the B scales per column, MN-major (b_scale[kb * sb_ld + column]).
template <int WARPS_M, int STAGES, bool kAlignedRows, bool kColumnScales = false, class Src>
__device__ __forceinline__ void load_stage(const Src& t, uint8_t* stage, int m0, int n0, int kb, int tid) {
  using T = Traits<WARPS_M, STAGES, kColumnScales>;
  const int64_t k_off = int64_t(kb) * kBlockK;
  uint8_t* sa_tile = stage;
  uint8_t* sb_tile = stage + T::kABytes;
  float* s_scale = reinterpret_cast<float*>(stage + T::kABytes + T::kBBytes);
#pragma unroll
  for (int c = tid; c < T::kBlockM * 8; c += T::kThreads) {
    const int row = c >> 3, chunk = c & 7, g = m0 + row;
    const bool in = g < t.m;
    cp_async16(sa_tile + swizzle(row, chunk), in ? t.a + g * t.lda + k_off + chunk * 16 : t.a, in ? 16 : 0);
  }
#pragma unroll
  for (int c = tid; c < kBlockN * 8; c += T::kThreads) {
    const int row = c >> 3, chunk = c & 7, g = n0 + row;
    const bool in = g < t.n;
    cp_async16(sb_tile + swizzle(row, chunk), in ? t.b + g * t.ldb + k_off + chunk * 16 : t.b, in ? 16 : 0);
  }
  if (kAlignedRows) {
    // A scales of the tile's rows for this K block: contiguous in the MN-major layout.
    for (int c = tid; c < T::kBlockM / 4; c += T::kThreads) {
      const int g = m0 + 4 * c;
      const int bytes = g < t.m ? 4 * min(4, t.m - g) : 0;
      cp_async16(s_scale + 4 * c, bytes ? t.a_scale + kb * t.sa_ld + g : t.a_scale, bytes);
    }
  } else {
    for (int r = tid; r < T::kBlockM; r += T::kThreads) {
      const int g = m0 + r;
      const bool in = g < t.m;
      cp_async4(s_scale + r, in ? t.a_scale + kb * t.sa_ld + g : t.a_scale, in ? 4 : 0);
    }
  }
  if constexpr (kColumnScales) {
    // N % 16 == 0: four columns are all inside N or all past it (zero-filled, never stored). n0 % 128 == 0 and
    // sb_ld % 4 == 0 (kWgradBScaleLdMultiple) keep each 16-byte copy aligned.
    float* s_col = reinterpret_cast<float*>(stage + T::kABytes + T::kBBytes + T::kScaleBytes);
    for (int c = tid; c < kBlockN / 4; c += T::kThreads) {
      const int col = n0 + 4 * c;
      const bool in = col < t.n;
      cp_async16(s_col + 4 * c, in ? t.b_scale + int64_t(kb) * t.sb_ld + col : t.b_scale, in ? 16 : 0);
    }
  }
}

template <int WARPS_M, int STAGES>
using TileAcc = float[Traits<WARPS_M, STAGES>::kMmaM][Traits<WARPS_M, STAGES>::kMmaN][4];

// The tile's GEMM: rows [m0, m0 + kBlockM) of t.a, columns [n0, n0 + 128) of t.b, K blocks [kb_begin, kb_begin +
// num_kb), promoted with both scales into total: b_scale_row[kb] for the whole tile, or with kColumnScales each
// column's own (load_stage; b_scale_row unused). Every thread of the block calls it (it holds __syncthreads).
template <int WARPS_M, int STAGES, bool kAlignedRows, bool kColumnScales = false, class Src>
__device__ __forceinline__ void tile_mainloop(const Src& t, const float* b_scale_row, uint8_t* smem, int m0, int n0,
                                              int kb_begin, int num_kb, TileAcc<WARPS_M, STAGES>& total) {
  using T = Traits<WARPS_M, STAGES, kColumnScales>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::kWarpsN, warp_n = warp % T::kWarpsN;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_kb)
      load_stage<WARPS_M, STAGES, kAlignedRows, kColumnScales>(t, smem + s * T::kStageBytes, m0, n0, kb_begin + s, tid);
    cp_async_commit();
  }

#pragma unroll
  for (int mi = 0; mi < T::kMmaM; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kMmaN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[mi][ni][e] = 0.0f;
  // ldmatrix lane roles: lanes 8i..8i+7 give the row addresses of 8x8 (b16) matrix i.
  const int mat = lane >> 3, mat_row = lane & 7;
  const int a_row0 = warp_m * T::kWarpTileM + mat_row + (mat & 1) * 8, a_khalf = mat >> 1;
  const int b_row0 = warp_n * T::kWarpTileN + mat_row + (mat >> 1) * 8, b_khalf = mat & 1;

  for (int it = 0; it < num_kb; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `it` landed for all threads; stage `it - 1` is no longer read
    const int next = it + STAGES - 1;
    if (next < num_kb)
      load_stage<WARPS_M, STAGES, kAlignedRows, kColumnScales>(t, smem + (next % STAGES) * T::kStageBytes, m0, n0,
                                                               kb_begin + next, tid);
    cp_async_commit();

    const uint8_t* stage = smem + (it % STAGES) * T::kStageBytes;
    float b_scale = 0.0f;
    if constexpr (!kColumnScales) b_scale = __ldg(b_scale_row + kb_begin + it);
    float acc[T::kMmaM][T::kMmaN][4] = {};
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks) {
      uint32_t af[T::kMmaM][4], bf[T::kMmaN][2];
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi) ldmatrix_x4(af[mi], stage + swizzle(a_row0 + mi * 16, ks * 2 + a_khalf));
#pragma unroll
      for (int nj = 0; nj < T::kMmaN / 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, stage + T::kABytes + swizzle(b_row0 + nj * 16, ks * 2 + b_khalf));
        bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1], bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi)
#pragma unroll
        for (int ni = 0; ni < T::kMmaN; ++ni) mma_e4m3(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
    // Promotion: fold this K block's partial into the fp32 total with both scales.
    const float* s_scale = reinterpret_cast<const float*>(stage + T::kABytes + T::kBBytes);
    if constexpr (kColumnScales) {
      // acc * (a_scale[row] * b_scale[col]): the forward's product where the column scales repeat a block's.
      const float* s_col = reinterpret_cast<const float*>(stage + T::kABytes + T::kBBytes + T::kScaleBytes);
      float2 sb[T::kMmaN];  // this thread's two columns of each 8-wide MMA tile
#pragma unroll
      for (int ni = 0; ni < T::kMmaN; ++ni)
        sb[ni] = *reinterpret_cast<const float2*>(s_col + warp_n * T::kWarpTileN + ni * 8 + (lane & 3) * 2);
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi) {
        const int r = warp_m * T::kWarpTileM + mi * 16 + (lane >> 2);
        const float sa_lo = s_scale[r], sa_hi = s_scale[r + 8];
#pragma unroll
        for (int ni = 0; ni < T::kMmaN; ++ni) {
          total[mi][ni][0] += acc[mi][ni][0] * (sa_lo * sb[ni].x);
          total[mi][ni][1] += acc[mi][ni][1] * (sa_lo * sb[ni].y);
          total[mi][ni][2] += acc[mi][ni][2] * (sa_hi * sb[ni].x);
          total[mi][ni][3] += acc[mi][ni][3] * (sa_hi * sb[ni].y);
        }
      }
    } else {
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi) {
        const int r = warp_m * T::kWarpTileM + mi * 16 + (lane >> 2);
        const float s_lo = s_scale[r] * b_scale, s_hi = s_scale[r + 8] * b_scale;
#pragma unroll
        for (int ni = 0; ni < T::kMmaN; ++ni) {
          total[mi][ni][0] += acc[mi][ni][0] * s_lo;
          total[mi][ni][1] += acc[mi][ni][1] * s_lo;
          total[mi][ni][2] += acc[mi][ni][2] * s_hi;
          total[mi][ni][3] += acc[mi][ni][3] * s_hi;
        }
      }
    }
  }
  cp_async_wait<0>();
}

// Epilogue: each quad of lanes owns 2 adjacent columns of an 8-wide MMA tile, rows g and g + 8; store(row, col, x, y)
// gets the pairs inside rows [m0, row_end) and columns [n0, n), nothing else (another group's rows, the tails).
// N % 16 == 0, so an 8-wide tile is either wholly inside N or wholly outside.
template <int WARPS_M, int STAGES, class Store>
__device__ __forceinline__ void tile_store(const TileAcc<WARPS_M, STAGES>& total, int m0, int row_end, int n0, int n,
                                           Store store) {
  using T = Traits<WARPS_M, STAGES>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / T::kWarpsN, warp_n = warp % T::kWarpsN;
#pragma unroll
  for (int mi = 0; mi < T::kMmaM; ++mi) {
#pragma unroll
    for (int ni = 0; ni < T::kMmaN; ++ni) {
      const int col = n0 + warp_n * T::kWarpTileN + ni * 8 + (lane & 3) * 2;
      if (col >= n) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_m * T::kWarpTileM + mi * 16 + (lane >> 2) + half * 8;
        if (row >= row_end) continue;
        store(row, col, total[mi][ni][2 * half], total[mi][ni][2 * half + 1]);
      }
    }
  }
}

// Two adjacent columns of out (row stride ldo elements), bf16 or fp32.
__device__ __forceinline__ void store_pair(void* out, int64_t ldo, bool fp32, int row, int col, float x, float y) {
  if (fp32)
    *reinterpret_cast<float2*>(static_cast<float*>(out) + row * ldo + col) = make_float2(x, y);
  else
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + row * ldo + col) = __floats2bfloat162_rn(x, y);
}

template <int WARPS_M, int STAGES>
// The dense kernel keeps its own copy of the loop: calling tile_mainloop/tile_store changed its SASS (about 13%
// more instructions before the first MMA on sm_120), and the dense path must not slow down.
__global__ void __launch_bounds__(Traits<WARPS_M, STAGES>::kThreads, 1) gemm_kernel(const Params p) {
  using T = Traits<WARPS_M, STAGES>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::kWarpsN, warp_n = warp % T::kWarpsN;
  const int n0 = blockIdx.x * kBlockN, m0 = blockIdx.y * T::kBlockM;
  const int kb_total = p.k / kBlockK;
  const int kb_begin = blockIdx.z * p.kb_per_split;
  const int num_kb = min(kb_total, kb_begin + p.kb_per_split) - kb_begin;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_kb) load_stage<WARPS_M, STAGES, true>(p, smem + s * T::kStageBytes, m0, n0, kb_begin + s, tid);
    cp_async_commit();
  }

  float total[T::kMmaM][T::kMmaN][4] = {};
  const float* b_scale_row = p.b_scale + (n0 / kBlockN) * p.sb_ld;
  // ldmatrix lane roles: lanes 8i..8i+7 give the row addresses of 8x8 (b16) matrix i.
  const int mat = lane >> 3, mat_row = lane & 7;
  const int a_row0 = warp_m * T::kWarpTileM + mat_row + (mat & 1) * 8, a_khalf = mat >> 1;
  const int b_row0 = warp_n * T::kWarpTileN + mat_row + (mat >> 1) * 8, b_khalf = mat & 1;

  for (int it = 0; it < num_kb; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `it` landed for all threads; stage `it - 1` is no longer read
    const int next = it + STAGES - 1;
    if (next < num_kb) load_stage<WARPS_M, STAGES, true>(p, smem + (next % STAGES) * T::kStageBytes, m0, n0, kb_begin + next, tid);
    cp_async_commit();

    const uint8_t* stage = smem + (it % STAGES) * T::kStageBytes;
    const float b_scale = __ldg(b_scale_row + kb_begin + it);
    float acc[T::kMmaM][T::kMmaN][4] = {};
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks) {
      uint32_t af[T::kMmaM][4], bf[T::kMmaN][2];
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi) ldmatrix_x4(af[mi], stage + swizzle(a_row0 + mi * 16, ks * 2 + a_khalf));
#pragma unroll
      for (int nj = 0; nj < T::kMmaN / 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, stage + T::kABytes + swizzle(b_row0 + nj * 16, ks * 2 + b_khalf));
        bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1], bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < T::kMmaM; ++mi)
#pragma unroll
        for (int ni = 0; ni < T::kMmaN; ++ni) mma_e4m3(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
    // Promotion: fold this K block's partial into the fp32 total with both scales.
    const float* s_scale = reinterpret_cast<const float*>(stage + T::kABytes + T::kBBytes);
#pragma unroll
    for (int mi = 0; mi < T::kMmaM; ++mi) {
      const int r = warp_m * T::kWarpTileM + mi * 16 + (lane >> 2);
      const float s_lo = s_scale[r] * b_scale, s_hi = s_scale[r + 8] * b_scale;
#pragma unroll
      for (int ni = 0; ni < T::kMmaN; ++ni) {
        total[mi][ni][0] += acc[mi][ni][0] * s_lo;
        total[mi][ni][1] += acc[mi][ni][1] * s_lo;
        total[mi][ni][2] += acc[mi][ni][2] * s_hi;
        total[mi][ni][3] += acc[mi][ni][3] * s_hi;
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: each quad of lanes owns 2 adjacent columns of an 8-wide MMA tile, rows g and g + 8.
  // N % 16 == 0, so an 8-wide tile is either wholly inside N or wholly outside.
#pragma unroll
  for (int mi = 0; mi < T::kMmaM; ++mi) {
#pragma unroll
    for (int ni = 0; ni < T::kMmaN; ++ni) {
      const int col = n0 + warp_n * T::kWarpTileN + ni * 8 + (lane & 3) * 2;
      if (col >= p.n) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_m * T::kWarpTileM + mi * 16 + (lane >> 2) + half * 8;
        if (row >= p.m) continue;
        const float x = total[mi][ni][2 * half], y = total[mi][ni][2 * half + 1];
        if (p.partial) {
          float* dst = p.partial + (int64_t(blockIdx.z) * p.m + row) * p.n + col;
          *reinterpret_cast<float2*>(dst) = make_float2(x, y);
        } else if (p.out_fp32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * p.ldo + col) = make_float2(x, y);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * p.ldo + col) =
              __floats2bfloat162_rn(x, y);
        }
      }
    }
  }
}

}  // namespace fp8gemm_sm120
