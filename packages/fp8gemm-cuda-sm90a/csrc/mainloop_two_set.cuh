// The two-set main loop (MainLoop::kTwoSets, and per warpgroup MainLoop::kSplitWarpgroups): up to 128
// columns, two accumulator sets fit, so K block i + 1 is issued into one while block i's promotion reads
// the other, and a warpgroup's FFMAs overlap its own tensor-core work. B scales come from global memory:
// one per K block, two for a tile that straddles two scale blocks (96 wide).
#pragma once

#include "consumer.cuh"

namespace fp8gemm_sm90a {

// A K block in flight: its stage and B scales.
struct Block {
  int s;
  float sb0, sb1;
};

template <class C, int kCluster, class Former>
__device__ __forceinline__ void mainloop_two_set(Consumer<C, kCluster>& c, Former former, KRange k, ScaleRows sb_rows,
                                                 float (&total)[C::kSub][C::kAcc]) {
  constexpr bool kStraddles = Former::value < C::kGroups;
  float acc[C::kAcc], acc2[C::kAcc];
  const std::integral_constant<int, 1> one_newer;
  const std::integral_constant<int, 0> none_newer;
  // B scales in batches of 32 K blocks, lane i holding block (batch start + i)'s, loaded a batch
  // ahead: a load per K block, one block ahead, left its latency (a DRAM miss on every new line) on
  // the promotion's path.
  auto batch_at = [&](const float* row, int j0) {  // j0: this warpgroup's block count so far
    const int kb = k.begin + c.k_part + C::kSplitWG * (j0 + c.lane);
    return kb < k.end ? __ldg(row + kb) : 0.0f;
  };
  float batch = batch_at(sb_rows.first, 0), batch_next = batch_at(sb_rows.first, 32);
  float batch1 = 0.0f, batch1_next = 0.0f;  // the second row's, for straddling tiles
  if constexpr (kStraddles) batch1 = batch_at(sb_rows.next, 0), batch1_next = batch_at(sb_rows.next, 32);
  // Block j goes into acc (j even) or acc2 (j odd); named statically by unrolling pairs.
  auto next = [&](float (&into)[C::kAcc], int j, Block& b) {
    b.s = c.ring.stage;
    if (j % 32 == 0 && j > 0) {
      batch = batch_next, batch_next = batch_at(sb_rows.first, j + 32);
      if constexpr (kStraddles) batch1 = batch1_next, batch1_next = batch_at(sb_rows.next, j + 32);
    }
    b.sb0 = __shfl_sync(~0u, batch, j % 32);
    b.sb1 = kStraddles ? __shfl_sync(~0u, batch1, j % 32) : 0.0f;
    mbar_wait(&c.smem.full[b.s], c.ring.phase);
    c.issue(into, b.s, 0);
#pragma unroll
    for (int w = 0; w < C::kSplitWG; ++w) c.ring.advance();  // past the other warpgroup's block
  };
  // Promote the block in `from` once at most `in_flight` newer groups remain.
  auto finish = [&](auto in_flight, const float (&from)[C::kAcc], const Block& b) {
    const float sa_lo = c.a_scale_lo(b.s, 0);
    const float sa_hi = c.a_scale_hi(b.s, 0);
    wgmma_wait<decltype(in_flight)::value>();
    if (c.lane == 0) c.release(b.s);
    promote<C>(former, total[0], from, sa_lo, sa_hi, b.sb0, b.sb1);
  };
  const int n_all = k.end - k.begin;
  const int n = (n_all - c.k_part + C::kSplitWG - 1) / C::kSplitWG;  // this warpgroup's K blocks
  [[maybe_unused]] const Ring<C::kStages> ring_start = c.ring;
  if (c.k_part) c.ring.advance();
  if (!C::kSplitK || n > 0) {  // a 1-block split leaves the second warpgroup nothing
    Block prev, cur;
    next(acc, 0, prev);
    int j = 1;
    for (; j + 1 < n; j += 2) {
      next(acc2, j, cur);
      finish(one_newer, acc, prev);
      next(acc, j + 1, prev);
      finish(one_newer, acc2, cur);
    }
    if (j < n) {  // an even block count leaves the last block for acc2
      next(acc2, j, cur);
      finish(one_newer, acc, prev);
      finish(none_newer, acc2, cur);
    } else {
      finish(none_newer, acc, prev);
    }
  }
  if constexpr (C::kSplitK) c.ring = ring_start, c.ring.advance_by(n_all);  // both warpgroups past the tile
}

// The split warpgroups' hand-over at a tile's end (named barriers 12, 13): the second warpgroup's sums
// into the first's through shared memory. Returns whether this warpgroup holds the tile's sums and
// stores them.
template <class C>
__device__ __forceinline__ bool gather_split_sums(float* red, bool second, bool more_tiles, float (&total)[C::kAcc]) {
  const int slot = threadIdx.x % 128;  // the same accumulator layout in both warpgroups
  if (second) {
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) red[i * 128 + slot] = total[i];
  }
  named_bar_sync<12, 256>();
  if (second) {
    if (more_tiles) named_bar_sync<13, 256>();  // read out before the next tile's writes
    return false;
  }
#pragma unroll
  for (int i = 0; i < C::kAcc; ++i) total[i] += red[i * 128 + slot];
  if (more_tiles) named_bar_sync<13, 256>();
  return true;
}

}  // namespace fp8gemm_sm90a
