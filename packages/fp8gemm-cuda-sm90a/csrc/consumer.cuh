// A consumer warpgroup's building blocks, shared by the main loops: its pipeline view, issuing one K
// block's wgmma, releasing a stage, and promoting a K block's accumulator with both scales.
#pragma once

#include <type_traits>

#include "ptx.cuh"
#include "scheduler.cuh"
#include "wgmma.cuh"

namespace fp8gemm_sm90a {

// What a consumer warpgroup keeps across tiles: shared-memory addresses formed once (warp-uniform, so
// the descriptors live in uniform registers and the issue path per K block is a few adds), and its
// position in the stage ring and the B-scale segments.
template <class C, int kCluster>
struct Consumer {
  const SharedStorage<C>& smem;
  uint32_t a_desc_base, b_desc_base;
  uint32_t scale_addr;  // this thread's first A-scale row in stage 0
  uint32_t seg_scales_addr;
  uint32_t b_scales_addr;  // weight-gradient kernels: this thread's first B-scale column (2 (lane % 4)) in stage 0
  int lane, k_part;  // k_part: which of the split warpgroups' K blocks (0 without the split)
  Ring<C::kStages> ring;
  int seg = 0;  // B-scale segments read so far

  // Stage s is free (its scales are in registers already), here and in the cluster peer whose
  // half of the shared A or B tile it also holds.
  __device__ __forceinline__ void release(int s) {
    if constexpr (kCluster > 1) {
#pragma unroll
      for (int r = 0; r < kCluster; ++r) mbar_arrive_cluster(&smem.empty[s], r);
    } else {
      mbar_arrive(&smem.empty[s]);
    }
  }

  // One K block of stage s for the warpgroup's 64-row slice `slice`, into a fresh accumulator.
  __device__ __forceinline__ void issue(float (&into)[C::kAcc], int s, int slice) {
    const uint32_t a_lo = a_desc_base + s * (C::kABytes >> 4) + slice * (64 * kBlockK >> 4);
    const uint32_t b_lo = b_desc_base + s * (C::kBBytes >> 4);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks)  // K advances 32 bytes inside the 128-byte swizzle atom
      wgmma_e4m3(into, sw128_desc(a_lo + ks * 2), sw128_desc(b_lo + ks * 2), ks > 0);
    wgmma_commit();
  }

  // The A scales of stage s for this thread's rows (lane / 4 and + 8) of slice `slice`.
  __device__ __forceinline__ float a_scale_lo(int s, int slice) { return lds_f32(scale_addr + s * C::kBlockM * 4 + slice * 256); }
  __device__ __forceinline__ float a_scale_hi(int s, int slice) {
    return lds_f32(scale_addr + s * C::kBlockM * 4 + slice * 256 + 32);
  }

  // Weight-gradient kernels: the B scales of this thread's accumulator columns in stage s, columns 8g + 2 (lane % 4)
  // and + 1 (one pair per 8-column group g).
  __device__ __forceinline__ float2 b_scale_pair(int s, int g) {
    return lds_f32x2(b_scales_addr + s * C::kBlockN * 4 + 32 * g);
  }
};

// Adds one K block's accumulator to a slice's running total with both scales: the first kFormer
// 8-column groups take B scale sb0, the rest sb1 (kFormer is a compile-time constant, so there are
// no per-column selects). Accumulator layout: register 4g + {0,1} is row (lane/4), 4g + {2,3} row
// (lane/4 + 8).
template <class C, class Former>
__device__ __forceinline__ void promote(Former, float (&into)[C::kAcc], const float (&from)[C::kAcc], float sa_lo,
                                        float sa_hi, float sb0, float sb1) {
  constexpr int kFormer = Former::value;
  const float lo0 = sa_lo * sb0, hi0 = sa_hi * sb0, lo1 = sa_lo * sb1, hi1 = sa_hi * sb1;
#pragma unroll
  for (int g = 0; g < C::kGroups; ++g) {
    const float lo = g < kFormer ? lo0 : lo1, hi = g < kFormer ? hi0 : hi1;
    into[4 * g] += from[4 * g] * lo;
    into[4 * g + 1] += from[4 * g + 1] * lo;
    into[4 * g + 2] += from[4 * g + 2] * hi;
    into[4 * g + 3] += from[4 * g + 3] * hi;
  }
}

// The weight-gradient promotion: each accumulator column with its own B scale (1 x 128 along K, "1D1D"), each row
// with its A scale; the scale product first, as DeepGEMM's 1D1D kernel: into += from * (sa * sb). sb(g): group g's
// pair of B scales (from registers, or read from the stage here).
template <class C, class PairOf>
__device__ __forceinline__ void promote_columns(float (&into)[C::kAcc], const float (&from)[C::kAcc], float sa_lo,
                                                float sa_hi, PairOf sb) {
#pragma unroll
  for (int g = 0; g < C::kGroups; ++g) {
    const float2 b = sb(g);
    into[4 * g] += from[4 * g] * (sa_lo * b.x);
    into[4 * g + 1] += from[4 * g + 1] * (sa_lo * b.y);
    into[4 * g + 2] += from[4 * g + 2] * (sa_hi * b.x);
    into[4 * g + 3] += from[4 * g + 3] * (sa_hi * b.y);
  }
}

// Calls f(std::integral_constant<int, kFormer>) for a tile whose first column is `offset` (< 128)
// into its 128-wide B-scale block: its first kFormer 8-column groups take that block's scale, the
// rest the next one's. Only the offsets kBlockN can produce (multiples of gcd(kBlockN, 128)) get an
// instantiation: one for the widths dividing 128, two for 192, four for 96 and 160.
template <int kBlockN, int kOffset = 0, typename F>
__device__ __forceinline__ void with_former(int offset, F&& f) {
  constexpr int kGroups = kBlockN / 8, kLeft = (kBlockK - kOffset) / 8, kStep = gcd(kBlockN, kBlockK);
  const std::integral_constant<int, (kLeft < kGroups ? kLeft : kGroups)> former;
  // Widths dividing 128 never straddle: one loop, whatever the offset (kFormer = kGroups at 0).
  if constexpr (kBlockK % kBlockN == 0 || kOffset + kStep >= kBlockK) f(former);
  else if (offset == kOffset) f(former);
  else with_former<kBlockN, kOffset + kStep>(offset, f);
}

// The B-scale rows of a tile whose first column is n_first: the 128-block holding that column and
// the next one (past N, the first again). A tile wholly past N (the odd one out of an N pair) reads
// the last row; its columns are masked either way. A grouped tile's group's rows.
struct ScaleRows {
  const float *first, *next;
};
template <class C>
__device__ __forceinline__ ScaleRows b_scale_rows(const Params& p, const Tile& tile, int n_first) {
  const int n_row = min(n_first, p.n - 1) / kBlockK;
  const float* base = C::kType == GemmType::kGrouped ? p.b_scale + tile.group * p.sb_gs : p.b_scale;
  const float* first = base + n_row * p.sb_ld;
  return {first, (n_row + 1) * kBlockK < p.n ? first + p.sb_ld : first};
}

}  // namespace fp8gemm_sm90a
