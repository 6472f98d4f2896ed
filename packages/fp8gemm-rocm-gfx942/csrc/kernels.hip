// FP8 (e4m3fnuz) block-scaled GEMM for gfx942 (MI300X) with MFMA 32x32x16 FP8.
//
// out[m, n] = sum_kb a_scale[m, kb] * b_scale[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// A workgroup (4 wavefronts) computes a BM x 128 tile; each wavefront owns TM x TN MFMA tiles of
// 32 x 32. K advances in 64-byte chunks through two LDS buffers: chunk c + 1 is fetched from global
// memory into registers while chunk c is multiplied, then written to the other buffer, so one
// barrier per chunk suffices. After every second chunk (one 128-wide scale block) the MFMA partial
// is promoted into the fp32 total with both scales. Rows past M and N are zero-filled on load and
// masked on store.
//
// Header-light: compiled either by ROCm's hipcc (FP8GEMM_HIP_HEADERS: the HIP runtime headers) or
// by a bare clang++ -nogpuinc (CI, Debian's clang-19), which needs only hip_compat.hpp's declarations.
#include "hip_compat.hpp"
#include "launch.hpp"

namespace fp8gemm_gfx942 {

typedef float floatx16 __attribute__((ext_vector_type(16)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));

constexpr int kChunkK = 64;       // bytes of K per LDS buffer
constexpr int kLdsRow = 80;       // 64 bytes + 16 of padding: rows land on distinct banks, 16-byte aligned
constexpr int kWaveSize = 64;

template <int WM, int WN, int TM, int TN>
struct Cfg {
  static_assert(WM * WN * kWaveSize == kThreads, "4 wavefronts per workgroup");
  static_assert(WN * TN * 32 == kBlockN, "the tile is 128 wide (one b_scale block)");
  static constexpr int kBlockM = WM * TM * 32;
  static constexpr int kAVecs = kBlockM * kChunkK / 16;  // 16-byte vectors per chunk of A
  static constexpr int kBVecs = kBlockN * kChunkK / 16;
  static constexpr int kAPerThread = (kAVecs + kThreads - 1) / kThreads;
  static constexpr int kBPerThread = kBVecs / kThreads;
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

template <int WM, int WN, int TM, int TN>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void gemm_kernel(const Params p) {
  using C = Cfg<WM, WN, TM, TN>;
  __shared__ __attribute__((aligned(16))) uint8_t lds_a[2][C::kBlockM * kLdsRow];
  __shared__ __attribute__((aligned(16))) uint8_t lds_b[2][kBlockN * kLdsRow];
  __shared__ __attribute__((aligned(16))) float lds_scale[2][C::kBlockM];

  const int tid = thread_id(), lane = tid % kWaveSize, wave = tid / kWaveSize;
  const int wm = wave / WN, wn = wave % WN;
  const int n0 = __builtin_amdgcn_workgroup_id_x() * kBlockN;
  const int m0 = __builtin_amdgcn_workgroup_id_y() * C::kBlockM;
  const int kb_begin = __builtin_amdgcn_workgroup_id_z() * p.kb_per_split;
  const int kb_count = (p.k / kBlockK - kb_begin) < p.kb_per_split ? p.k / kBlockK - kb_begin : p.kb_per_split;
  const int chunks = 2 * kb_count;

  u32x4 ra[C::kAPerThread], rb[C::kBPerThread];
  float rs[4];
  auto fetch = [&](int c) {  // global -> registers for chunk c (and the A scales at a block start)
    const int64_t k_off = int64_t(kb_begin) * kBlockK + int64_t(c) * kChunkK;
#pragma unroll
    for (int i = 0; i < C::kAPerThread; ++i) {
      const int v = tid + i * kThreads, row = v / 4, col = (v % 4) * 16;
      ra[i] = load16(p.a, m0 + row, p.lda, k_off + col, v < C::kAVecs && m0 + row < p.m);
    }
#pragma unroll
    for (int i = 0; i < C::kBPerThread; ++i) {
      const int v = tid + i * kThreads, row = v / 4, col = (v % 4) * 16;
      rb[i] = load16(p.b, n0 + row, p.ldb, k_off + col, n0 + row < p.n);
    }
    if (c % 2 == 0 && tid < C::kBlockM / 4) {
      const float* col = p.a_scale + int64_t(kb_begin + c / 2) * p.sa_ld;
#pragma unroll
      for (int j = 0; j < 4; ++j) rs[j] = m0 + 4 * tid + j < p.m ? col[m0 + 4 * tid + j] : 0.0f;
    }
  };
  auto stash = [&](int c) {  // registers -> LDS buffer c % 2
#pragma unroll
    for (int i = 0; i < C::kAPerThread; ++i) {
      const int v = tid + i * kThreads;
      if (v < C::kAVecs) *reinterpret_cast<u32x4*>(&lds_a[c % 2][(v / 4) * kLdsRow + (v % 4) * 16]) = ra[i];
    }
#pragma unroll
    for (int i = 0; i < C::kBPerThread; ++i) {
      const int v = tid + i * kThreads;
      *reinterpret_cast<u32x4*>(&lds_b[c % 2][(v / 4) * kLdsRow + (v % 4) * 16]) = rb[i];
    }
    if (c % 2 == 0 && tid < C::kBlockM / 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) lds_scale[(c / 2) % 2][4 * tid + j] = rs[j];
    }
  };

  floatx16 total[TM][TN], acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) total[i][j] = acc[i][j] = floatx16{};

  // MFMA 32x32x16 operand layout: lane l supplies row (l % 32), K bytes 8 * (l / 32) .. + 7.
  const int frag_row = lane % 32, frag_k = 8 * (lane / 32);
  const float* b_scale_row = p.b_scale + int64_t(n0 / kBlockN) * p.sb_ld;

  if (chunks > 0) {
    fetch(0);
    stash(0);
  }
  block_sync();
  for (int c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) fetch(c + 1);  // in flight while chunk c is multiplied
    const uint8_t* sa = lds_a[c % 2];
    const uint8_t* sb = lds_b[c % 2];
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
      const float bscale = b_scale_row[kb_begin + c / 2];
      const float* ascale = lds_scale[(c / 2) % 2];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          // Output layout of MFMA 32x32: register r of lane l is row 8*(r/4) + 4*(l/32) + r%4, column l%32.
          const float s = ascale[(wm * TM + i) * 32 + 8 * (r / 4) + 4 * (lane / 32) + r % 4] * bscale;
#pragma unroll
          for (int j = 0; j < TN; ++j) total[i][j][r] += acc[i][j][r] * s;
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = floatx16{};
      }
    }
    if (c + 1 < chunks) stash(c + 1);  // the other buffer: last read before the previous barrier
    block_sync();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int col = n0 + (wn * TN + j) * 32 + lane % 32;
      if (col >= p.n) continue;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const int row = m0 + (wm * TM + i) * 32 + 8 * (r / 4) + 4 * (lane / 32) + r % 4;
        if (row >= p.m) continue;
        const float x = total[i][j][r];
        if (p.partial)
          p.partial[(int64_t(__builtin_amdgcn_workgroup_id_z()) * p.m + row) * p.n + col] = x;
        else if (p.out_fp32)
          static_cast<float*>(p.out)[row * p.ldo + col] = x;
        else
          static_cast<uint16_t*>(p.out)[row * p.ldo + col] = to_bf16(x);
      }
    }
  }
}

// Split-K epilogue: out = sum of the fp32 partials over the splits.
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void reduce_splits(const Params p, int splits) {
  const int64_t count = int64_t(p.m) * p.n;
  const int64_t stride = int64_t(__builtin_amdgcn_grid_size_x());
  for (int64_t idx = int64_t(__builtin_amdgcn_workgroup_id_x()) * kThreads + thread_id(); idx < count; idx += stride) {
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += p.partial[int64_t(z) * count + idx];
    const int64_t row = idx / p.n, col = idx % p.n;
    if (p.out_fp32)
      static_cast<float*>(p.out)[row * p.ldo + col] = s;
    else
      static_cast<uint16_t*>(p.out)[row * p.ldo + col] = to_bf16(s);
  }
}

template <int WM, int WN, int TM, int TN>
int enqueue_tiles(const Params& p, const Geometry& g, void* stream) {
  void* args[] = {const_cast<Params*>(&p)};
  return hipLaunchKernel(reinterpret_cast<const void*>(&gemm_kernel<WM, WN, TM, TN>), dim3(g.grid_x, g.grid_y, g.grid_z),
                         dim3(kThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_gemm(const Params& p, const Geometry& g, void* stream) {
  // M128: 2 x 2 wavefronts of 2 x 2 MFMA tiles (128 x 128). M32: 1 x 4 wavefronts of 1 x 1 (32 x 128).
  return g.config == TileConfig::M128 ? enqueue_tiles<2, 2, 2, 2>(p, g, stream) : enqueue_tiles<1, 4, 1, 1>(p, g, stream);
}

int enqueue_reduce(const Params& p, int splits, int blocks, void* stream) {
  void* args[] = {const_cast<Params*>(&p), &splits};
  return hipLaunchKernel(reinterpret_cast<const void*>(&reduce_splits), dim3(blocks), dim3(kThreads), args, 0,
                         static_cast<hipStream_t>(stream));
}

}  // namespace fp8gemm_gfx942
