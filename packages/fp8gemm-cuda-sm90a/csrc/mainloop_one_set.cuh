// The one-set main loop (MainLoop::kOneSet): one accumulator set per warpgroup, each slice's K block
// promoted before the next is issued. The B scales come from shared-memory segments that the B-scale
// warp fills ahead (producer.cuh), each K block's read before its stage is waited for, so the scale
// product is ready when the wgmma is issued.
#pragma once

#include "consumer.cuh"

namespace fp8gemm_sm90a {

// One K block of stage s, its B scales given. Weight-gradient kernels read them per column from the stage: one slice,
// into registers while the wgmma runs; two slices (no registers to spare for them next to two running totals), inside
// the promotions, the stage released after the last one. `busy` false (a grouped warpgroup whose rows all lie outside
// the tile's group, scheduler.cuh idle_rows): the stage is released and nothing multiplied (a predicate, not a second
// loop, which spilled the 192-row kernel's registers).
template <class C, int kCluster, class Former>
__device__ __forceinline__ void one_set_block(Consumer<C, kCluster>& c, Former former, float (&acc)[C::kAcc],
                                              float (&total)[C::kSub][C::kAcc], int s, float sb0, float sb1,
                                              bool busy = true) {
  constexpr bool kLateRelease = C::kWgradLateRelease;
  [[maybe_unused]] float2 sb_cols[C::kWgrad && !kLateRelease ? C::kGroups : 1];
#pragma unroll
  for (int slice = 0; slice < C::kSub; ++slice) {
    if (busy) c.issue(acc, s, slice);
    const float sa_lo = c.a_scale_lo(s, slice);
    const float sa_hi = c.a_scale_hi(s, slice);
    if constexpr (C::kWgrad && !kLateRelease) {
#pragma unroll
      for (int g = 0; g < C::kGroups; ++g) sb_cols[g] = c.b_scale_pair(s, g);
    }
    wgmma_wait<0>();
    if constexpr (kLateRelease) {
      promote_columns<C>(total[slice], acc, sa_lo, sa_hi, [&](int g) { return c.b_scale_pair(s, g); });
      if (slice == C::kSub - 1) {
        __syncwarp();  // every lane's reads of the stage done
        if (c.lane == 0) c.release(s);
      }
      continue;
    }
    if (slice == C::kSub - 1) {
      if constexpr (C::kLane0Release) {
        __syncwarp();
        if (c.lane == 0) c.release(s);
      } else {
        c.release(s);  // every thread: see the empty barrier's count
      }
    }
    if constexpr (C::kWgrad) promote_columns<C>(total[slice], acc, sa_lo, sa_hi, [&](int g) { return sb_cols[g]; });
    else if (busy) promote<C>(former, total[slice], acc, sa_lo, sa_hi, sb0, sb1);
  }
}

// Weight-gradient kernels: the K blocks [k.begin, k.end) of one tile, each stage holding its B scales.
template <class C, int kCluster, class Former>
__device__ __forceinline__ void mainloop_one_set_columns(Consumer<C, kCluster>& c, Former former, KRange k,
                                                         float (&total)[C::kSub][C::kAcc]) {
  float acc[C::kAcc];
  auto step = [&] {
    const int s = c.ring.stage;
    mbar_wait(&c.smem.full[s], c.ring.phase);
    one_set_block(c, former, acc, total, s, 0.0f, 0.0f);
    c.ring.advance();
  };
  const int count = k.end - k.begin;
  if (C::kAlwaysUnrolled || count >= kUnrolledMinKb) {
#pragma unroll 8
    for (int i = 0; i < count; ++i) step();
  } else {
#pragma unroll 1
    for (int i = 0; i < count; ++i) step();
  }
}

// The K blocks [k.begin, k.end) of one tile into `total`, segment by segment.
template <class C, int kCluster, class Former>
__device__ __forceinline__ void mainloop_one_set(Consumer<C, kCluster>& c, Former former, KRange k,
                                                 float (&total)[C::kSub][C::kAcc], bool busy = true) {
  constexpr int kFormer = Former::value;
  float acc[C::kAcc];
  for (int kb0 = k.begin; kb0 < k.end; kb0 += kSegKb, ++c.seg) {
    const int b = c.seg & 1, count = min(kSegKb, k.end - kb0);
    mbar_wait(&c.smem.seg_full[b], (c.seg >> 1) & 1);
    const uint32_t row0 = c.seg_scales_addr + b * 2 * kSegKb * 4;
    auto step = [&](int i) {
      const float sb0 = lds_f32(row0 + 4 * i);
      const float sb1 = kFormer < C::kGroups ? lds_f32(row0 + kSegKb * 4 + 4 * i) : 0.0f;
      const int s = c.ring.stage;
      mbar_wait(&c.smem.full[s], c.ring.phase);
      one_set_block(c, former, acc, total, s, sb0, sb1, busy);
      c.ring.advance();
    };
    if (C::kAlwaysUnrolled || count >= kUnrolledMinKb) {  // see KernelTraits::kAlwaysUnrolled
#pragma unroll 8
      for (int i = 0; i < count; ++i) step(i);
    } else {
#pragma unroll 1
      for (int i = 0; i < count; ++i) step(i);
    }
    mbar_arrive(&c.smem.seg_empty[b]);  // every thread, after its last read of the segment
  }
}

}  // namespace fp8gemm_sm90a
