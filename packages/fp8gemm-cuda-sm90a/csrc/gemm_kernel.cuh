// FP8 block-scaled GEMM for Hopper (sm_90a): TMA + mbarrier pipeline, warp specialisation, wgmma.
//
// out[m, n] = sum_kb a_scale[m, kb] * b_scale[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// A persistent grid walks (m block, n block, K split) tiles. With kCluster = 2, two CTAs of a cluster
// take adjacent n blocks of one m block and each loads half of the shared A tile, multicast into both
// (256-row tiles, the plan's choice on large shapes); for the other tiles (an experiment, measured no
// faster) adjacent m blocks of one n block, sharing B. With kCluster = 1 the launch may still pair
// CTAs in 2-CTA clusters, for placement only (heuristics.hpp placement_pairs): the kernel never
// addresses its peer. Per CTA, one producer warpgroup (one thread issues TMA) fills a ring of kStages
// shared-memory stages, each holding one 128-wide K block of A (BLOCK_M x 128), B (BLOCK_N x 128) and
// A's scales (BLOCK_M floats; for the one-set loop, a second producer warp writes the tile's B scales
// ahead, in segments of 64 K blocks);
// kConsumers warpgroups of kSub 64-row slices each (kSub = 2: 256-row tiles from two warpgroups) multiply a
// stage with four wgmma m64nNk32 (N = BLOCK_N) per slice into a fresh fp32 accumulator, release the
// stage, and promote the accumulator into the slice's running total with both scales (the tensor
// core's FP8 accumulation is not full fp32, so it is never run for more than 128 of K). BLOCK_N is
// 16, 32, 64, 96, 128, 160 or 192; 96, 160 and 192 fill the SMs' waves of more N, and their tiles
// may straddle two 128-wide scale blocks, the first kFormer 8-column groups taking the first one's
// scale. Up to 128 columns with one slice per warpgroup, two accumulator sets fit, so the next K
// block is issued before this one is promoted; wider tiles, 256-row ones and 128 x 128 ones on long K
// (kOneSet) use one set. 64 x 16 and 64 x 32 tiles on long K may share their K blocks out over two
// consumer warpgroups (kSplitK), each with its own two sets.
// bf16 tiles leave through shared memory and TMA stores; for 256-row tiles a third producer warp
// issues those stores, so the consumers hand over their buffer and go straight on to the next tile.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "heuristics.hpp"
#include "tile_order.hpp"
#include "wgmma.cuh"

namespace fp8gemm_sm90a {

struct Params {
  void* out;              // [m, n] bf16 or fp32, row stride ldo (elements)
  float* partial;         // split-K: [splits][m][n] fp32, else null
  const float* b_scale;   // K-major: b_scale[(n / 128) * sb_ld + kb]
  int m, n, k;
  int64_t ldo, sb_ld;
  int out_fp32;
  int kb_per_split, splits, m_blocks, n_blocks;
  int tx_bytes;  // bytes per stage, as the tensor maps' boxes give them (launch_tiles.cuh: short_a)
  // The cluster tiles' order (groups of the plan's group_m M blocks for L2 reuse), its divisors computed at launch
  // (launch_tiles.cuh).
  TileOrder order;
};

// B-scale segments: the B scales of up to kSegKb K blocks of a tile (two 128-row blocks of N), double
// buffered, behind a full and an empty barrier each.
constexpr int kSegKb = 64;
constexpr int kSegBytes = 4 * 8 + 2 * 2 * kSegKb * 4;

__host__ __device__ constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// Pipeline depth: as many stages as shared memory holds next to the epilogue buffer and `extra`
// bytes, at most `cap` (12; see Cfg::kSplitWG for 20).
constexpr int stages_for(int block_m, int block_n, int extra = 0, int cap = 12) {
  const int per_stage = block_m * kBlockK + block_n * kBlockK + block_m * 4;
  const int epilogue = block_n % 32 == 0 ? block_m * block_n * 2 : 0;
  const int fit = (227 * 1024 - 2048 - epilogue - 2 * cap * 8 - kSegBytes - extra) / per_stage;  // 2048: alignment; barriers
  return fit < cap ? fit : cap;
}

// kSub: 64-row slices per consumer warpgroup. 2 gives 256-row tiles from two warpgroups (3/4 of the
// L2 -> SM bytes per FLOP of 128 x 128), their slices multiplied one after the other into one
// accumulator set. kOneSet: the one-set K loop where the two-set one would run (Plan::one_set_loop).
// kSplitK: a 64-row tile's K blocks shared by two warpgroups (Plan::split_k_warpgroups).
template <int kConsumers, int kBlockN, int kCluster, int kSub = 1, bool kOneSet = false, bool kSplitK = false>
struct Cfg {
  static constexpr int kBlockM = 64 * kConsumers * kSub;
  // K split over warpgroups: two consumer warpgroups on the same 64 rows, each taking every other K
  // block, so an SM runs two independent wgmma chains and promotions; the second hands its sums to
  // the first through shared memory (kRedBytes) at the tile's end. Its pipeline gets up to 20 stages,
  // as the loads must now keep up with two consumers.
  static constexpr int kSplitWG = kSplitK ? 2 : 1;
  static constexpr int kConsumerWGs = kConsumers * kSplitWG;
  static constexpr int kRedBytes = kSplitK ? 128 * (kBlockN / 2) * 4 : 0;
  static constexpr int kStages = stages_for(kBlockM, kBlockN, kRedBytes, kSplitK ? 20 : 12);
  static_assert(!kSplitK || (kConsumers == 1 && kSub == 1 && !kOneSet && kCluster == 1 && kBlockN <= kBlockK),
                "K split over warpgroups: 64-row two-set tiles");
  static_assert(kStages >= 3, "at least three pipeline stages");
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs");
  // 2-CTA clusters pair tiles along N, sharing (multicasting) the A tile, or along M, sharing B
  // (heuristics.hpp pairs_along_n).
  static constexpr bool kAlongN = kCluster > 1 && pairs_along_n(kConsumers * kSub);
  static_assert(kBlockN >= 16 && kBlockN <= 192 && kBlockN % 16 == 0, "BLOCK_N: a multiple of 16 up to 192");
  // A tile takes the B scales of at most two 128-wide blocks (its furthest start into one is 128 -
  // gcd(BLOCK_N, 128)): 176, starting 112 columns in, would reach into a third.
  static_assert(kBlockK - gcd(kBlockN, kBlockK) + kBlockN <= 2 * kBlockK,
                "BLOCK_N: tiles straddle at most two scale blocks");
  static_assert(kSub == 1 || (kSub == 2 && kBlockN <= kBlockK), "two slices per warpgroup: up to 128 columns");
  static constexpr int kAcc = kBlockN / 2;           // fp32 accumulators per thread (m64nNk32)
  static constexpr int kGroups = kBlockN / 8;        // 8-column groups: accumulators 4g .. 4g + 3
  static constexpr bool kUniformScaleB = kBlockK % kBlockN == 0;  // no tile straddles two scale blocks
  // Two accumulator sets (see mainloop_overlapped) fit the registers up to 128 columns and 2
  // consumers; 128 x 128 tiles on long K run the one-set loop instead (heuristics.hpp one_set_loop).
  static constexpr bool kOverlap = !kOneSet && kBlockN <= kBlockK && kConsumers <= 2 && kSub == 1;
  // The one-set loop reads its B scales from shared-memory segments that a producer warp fills
  // ahead (kSegKb K blocks at a time), each K block's before it waits for the stage, so the scale
  // product is ready when the wgmma is issued: +1-4% on the 256-row tiles over a per-stage copy
  // (itself +3-10% over loads in the consumers). The two-set loop loads them itself: it measured
  // 6-15% slower with the stage copy (decode and 128 x 128 tiles).
  static constexpr bool kSegmentScalesB = !kOverlap;
  static constexpr bool kTmaStore = kBlockN % 32 == 0;  // bf16 epilogue through shared memory and TMA stores
  // Boxes of 64 columns (128-byte rows, 128-byte swizzle) spanning a warpgroup's rows: 2 TMA stores
  // per warpgroup of a 256 x 128 tile instead of 8 (32-wide tiles keep 64 x 32 boxes).
  static constexpr bool kWideStore = kBlockN % 64 == 0;
  // 256-row tiles hand their epilogue buffer to a producer warp that issues the TMA stores and waits
  // for them, so no consumer warp lags behind its warpgroup into the next tile's first wgmma.
  static constexpr bool kStoreWarp = kTmaStore && kSub == 2;
  // The one-set loop's stage release: one arrive per consumer warp (lane 0's) on 256-row tiles,
  // one per thread elsewhere (the configurations measured best; the two-set loop: per warp).
  static constexpr bool kLane0Release = kSub == 2;
  // The one-set loop unrolled 8 times, as DeepGEMM's is: on 256-row tiles 192-194 instructions per K
  // block and warp instead of 202 (the stage ring's wrap and the segment's loop bound are no longer
  // paid per block); 1.01x geomean over ten 256-row shapes, 4096x4096x7168 1.019x (sweeps
  // "20_fourteenth_session" run_g). The other one-set tiles gained with it on long K but lost 1-3% at
  // 12 K blocks per tile (run_h), so they run the unrolled copy of the loop only on segments of at
  // least kUnrolledMinKb (heuristics.hpp: 24) K blocks, the rolled one below: 1.009x geomean over 17
  // shapes, 2048x2112x7168 1.07x, 1024x2112x3072 1.04x, one loss, 1536x1536x7168 0.96x
  // ("21_fifteenth_session" run_a, run_b).
  static constexpr bool kAlwaysUnrolled = kSub == 2;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  // 64-row tiles issue their TMA loads from an elected lane of the producer's first warp instead of
  // lane 0: ptxas then knows one thread runs the loop and drops the per-TMA uniformity loop
  // (ELECT + BRA.U.ANY) around each UTMALDG. A stage took ~220 SM cycles to issue that way (clock64
  // trace, H200), as long as a 1 x 16 tile's consumer takes per K block, so the loads barely kept
  // ahead; elected: ~110, as DeepGEMM's producer. 1.024x geomean over 13 decode shapes, 128x4096x7168
  // 1.07, 64x2112x7168 1.06 (sweeps "24_eighteenth_session"). The wider tiles' consumers are slower
  // than either, and their kernels measured no better with it (1024x1536x7168 0.97-0.98), so they keep lane 0.
  static constexpr bool kElectedProducer = kConsumers == 1;
  // Registers per consumer thread after the producer gives most of its own back (setmaxnreg). The
  // pool is what the launch allocated (65536 / kThreads per thread, a multiple of 8, at most 255);
  // asking for more than it holds hangs setmaxnreg.inc. Two consumers: 168 x 384 = 128 x 40 + 256 x 232.
  static constexpr int kProducerRegs = 40;
  static constexpr int kLaunchRegs = (65536 / kThreads > 255 ? 255 : 65536 / kThreads) / 8 * 8;
  static constexpr int kPoolRegs = kLaunchRegs * kThreads - 128 * kProducerRegs;
  static constexpr int kConsumerRegsFit = kPoolRegs / (128 * kConsumerWGs) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsFit > 232 ? 232 : kConsumerRegsFit;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kSBytes = kBlockM * 4;
  // [A x stages][B x stages][A scales x stages][epilogue][full bars][empty bars][B-scale segment bars,
  // segments]; tiles 1024-byte aligned (SW128).
  // bf16 output leaves through shared memory and TMA stores (boxes: see kWideStore; the swizzle
  // keeps the stmatrix writes from the accumulator layout conflict-free).
  static constexpr int kEpiBytes = kTmaStore ? kBlockM * kBlockN * 2 : 0;
  static constexpr int kEpiOffset = (kStages * (kABytes + kBBytes + kSBytes) + 1023) / 1024 * 1024;  // SW128 base
  static constexpr int kBarOffset = kEpiOffset + kEpiBytes;
  static constexpr int kSegOffset = kBarOffset + 2 * kStages * 8;
  static constexpr int kRedOffset = kSegOffset + kSegBytes;
  static constexpr int kSmemBytes = kRedOffset + kRedBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "Hopper allows 227 KB of shared memory per block");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ float lds_f32(uint32_t smem_addr) {  // a plain C++ read would be a generic LD
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_addr) : "memory");
  return v;
}

// An opaque copy: the compiler must keep the value in a register rather than rematerialise it.
__device__ __forceinline__ uint32_t pinned(uint32_t v) {
  asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}

// True on one lane of a converged warp (elect.sync): code under it is known to run on one thread.
__device__ __forceinline__ bool elect_one() {
  uint32_t pred;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred));
  return pred != 0;
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrive on the barrier at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// TMA load delivered to the same offset in every CTA of `mask`, completing on each one's barrier.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
// The low word (start address / 16, leading-byte offset 1) varies per stage and K step and is
// formed by adding to a base; the high word (stride 1024 bytes, swizzle mode) is a constant.
__device__ __forceinline__ uint32_t sw128_desc_lo(uint32_t smem_addr) { return (smem_addr >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t sw128_desc(uint32_t lo) {
  return uint64_t(lo) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// A TMA box of fp32 scales starts and spans whole 16 bytes in its inner dimension (M): 4 rows.
__host__ __device__ constexpr int round_up_to_4_rows(int rows) { return (rows + 3) & ~3; }

struct Tile {
  int m_block, n_block, split;
  int row0;  // first row of A and of the output it covers (see tile_at)
};

// Cluster tiles: a cluster takes kCluster adjacent blocks along M (or along N).
template <int kCluster, bool kAlongN>
__host__ __device__ __forceinline__ int m_groups_of(const Params& p) { return kAlongN ? p.m_blocks : (p.m_blocks + kCluster - 1) / kCluster; }
template <int kCluster, bool kAlongN>
__host__ __device__ __forceinline__ int n_groups_of(const Params& p) { return kAlongN ? (p.n_blocks + kCluster - 1) / kCluster : p.n_blocks; }

template <int kCluster, bool kAlongN, int kBlockM>
__device__ __forceinline__ Tile tile_at(const Params& p, int t, int rank) {
  // t counts cluster tiles. Within a split, tiles are walked in groups of group_m M blocks, M
  // fastest inside a group (tile_order.hpp): the ~one wave of CTAs running together then touches group_m
  // blocks of A and a wave's worth of B blocks, which stay in L2 while every CTA streams through K.
  const TileIndex index = tile_index(p.order, t);
  Tile tile;
  tile.split = index.split;
  // A cluster's padding block past the end (odd count) takes the last rows again (row0 below).
  if constexpr (kAlongN) {
    tile.m_block = index.m;
    tile.n_block = index.n * kCluster + rank;
  } else {
    tile.m_block = index.m * kCluster + rank;
    tile.n_block = index.n;
  }
  // The last M block (and a cluster's padding block past it) ends at row M instead of past it, so
  // the rows TMA loads are real: TMA fills rows past the end far slower than it loads real ones
  // (sweeps "16_tenth_session"). It recomputes rows of the block before it, and stores them again
  // with identical values. The start is rounded up to 4 rows (at most 3 past M), since a TMA box
  // must start 16-byte aligned in its inner dimension, M for the A scales (an illegal instruction
  // otherwise). A tile taller than M loads boxes of its M rows instead (launch_tiles.cuh).
  tile.row0 = min(tile.m_block * kBlockM, round_up_to_4_rows(max(p.m - kBlockM, 0)));
  return tile;
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
// the last row; its columns are masked either way.
struct ScaleRows {
  const float *first, *next;
};
__device__ __forceinline__ ScaleRows b_scale_rows(const Params& p, int n_first) {
  const int n_row = min(n_first, p.n - 1) / kBlockK;
  const float* first = p.b_scale + n_row * p.sb_ld;
  return {first, (n_row + 1) * kBlockK < p.n ? first + p.sb_ld : first};
}

// Named barriers of the store-warp epilogue (the per-warpgroup ones are 1 + warpgroup).
constexpr int kEpiFullBar = 4, kEpiFreeBar = 8;

// Pipeline position: stage index and the parity of its current round, advanced together (no
// division on the consumers' issue path).
template <int kStages>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  __device__ __forceinline__ void advance_by(int n) {
    const int s = stage + n;
    phase ^= (s / kStages) & 1;
    stage = s % kStages;
  }
};

__device__ __forceinline__ void prefetch_l2(const void* line) { asm volatile("prefetch.global.L2 [%0];" ::"l"(line)); }

__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// One consumer warpgroup's bf16 tile from its epilogue buffer to global memory (one thread).
template <typename C, int kBlockN, int kSub>
__device__ __forceinline__ void store_warpgroup_tile(const CUtensorMap* map_out, const uint8_t* buf, const Params& p,
                                                     int row0, int n_first, int warpgroup) {
  if constexpr (C::kWideStore) {
    const int row = row0 + warpgroup * kSub * 64;
    if (row < p.m) {
#pragma unroll
      for (int c = 0; c < kBlockN / 64; ++c)
        if (n_first + 64 * c < p.n) tma_store_2d(map_out, buf + c * (kSub * 64 * 128), n_first + 64 * c, row);
    }
  } else {
#pragma unroll
    for (int slice = 0; slice < kSub; ++slice) {
      const int row = row0 + (warpgroup * kSub + slice) * 64;
      if (row < p.m) {
#pragma unroll
        for (int c = 0; c < kBlockN / 32; ++c)
          if (n_first + 32 * c < p.n)
            tma_store_2d(map_out, buf + slice * 64 * kBlockN * 2 + c * 64 * 64, n_first + 32 * c, row);
      }
    }
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

template <int kConsumers, int kBlockN, int kCluster, int kSub, bool kOneSet, bool kSplitK>
__global__ void __launch_bounds__(Cfg<kConsumers, kBlockN, kCluster, kSub, kOneSet, kSplitK>::kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                const __grid_constant__ CUtensorMap map_scale, const __grid_constant__ CUtensorMap map_out,
                const Params p) {
  using C = Cfg<kConsumers, kBlockN, kCluster, kSub, kOneSet, kSplitK>;
  constexpr int kStages = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;
  uint8_t* tiles_b = smem + kStages * C::kABytes;
  float* scales = reinterpret_cast<float*>(smem + kStages * (C::kABytes + C::kBBytes));
  uint8_t* epilogue = smem + C::kEpiOffset;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarOffset);
  uint64_t* empty = full + kStages;
  // The one-set loop's B scales: segments of kSegKb K blocks, written by the B-scale warp ahead of the
  // consumers, who read each K block's (the tile's 128-block of N and the next) before waiting for
  // its stage.
  uint64_t* seg_full = reinterpret_cast<uint64_t*>(smem + C::kSegOffset);
  uint64_t* seg_empty = seg_full + 2;
  float* seg_scales = reinterpret_cast<float*>(seg_empty + 2);  // [buffer][row][kSegKb]

  const int warpgroup = threadIdx.x / 128;
  const int kb_total = p.k / kBlockK;
  const int num_tiles = m_groups_of<kCluster, C::kAlongN>(p) * n_groups_of<kCluster, C::kAlongN>(p) * p.splits;
  const int first_tile = blockIdx.x / kCluster, tile_stride = gridDim.x / kCluster;
  const int rank = kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);  // the TMA thread's, with the byte count
      // One arrival per consumer warp (per thread: see kLane0Release) of every CTA whose half lands
      // here.
      mbar_init(&empty[s], kCluster * kConsumers * (!C::kOverlap && !C::kLane0Release ? 128 : 4));
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(&seg_full[b], 32);                    // every lane of the B-scale warp
      mbar_init(&seg_empty[b], kConsumers * 128);     // every consumer thread, after its last read
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (threadIdx.x == C::kConsumerWGs * 128) {  // descriptors into the cache while the barriers settle
    prefetch_map(&map_a);
    prefetch_map(&map_b);
    prefetch_map(&map_scale);
    prefetch_map(&map_out);
  }
  if constexpr (kCluster > 1) cluster_sync();  // peers' barriers exist before anyone signals them
  else __syncthreads();

  if (warpgroup == C::kConsumerWGs) {  // producer warpgroup: the last one
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(C::kProducerRegs));
    // Warp 0: the TMA thread. Warp 1 (one-set loop): the B-scale warp, a warp of its own so that its
    // lanes load a segment's scales at once, one load latency per segment. Warp 2 (256-row tiles):
    // the store warp.
    const int producer_warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool tma_thread = producer_warp == 0 && (C::kElectedProducer ? elect_one() : lane == 0);
    if (tma_thread || (C::kSegmentScalesB && producer_warp == 1)) {
      Ring<kStages> ring;
      int seg = 0;  // B-scale segments written so far
      for (int t = first_tile; t < num_tiles; t += tile_stride) {
        const Tile tile = tile_at<kCluster, C::kAlongN, C::kBlockM>(p, t, rank);
        const int kb_begin = tile.split * p.kb_per_split;
        const int kb_end = min(kb_total, kb_begin + p.kb_per_split);
        if (C::kSegmentScalesB && producer_warp == 1) {
          // A tile whose width does not divide 128 may straddle two scale blocks.
          const auto [sb_row0, sb_row1] = b_scale_rows(p, tile.n_block * kBlockN);
          for (int kb0 = kb_begin; kb0 < kb_end; kb0 += kSegKb, ++seg) {
            const int b = seg & 1;
            mbar_wait(&seg_empty[b], ((seg >> 1) & 1) ^ 1);  // a fresh barrier passes the first round
            float* dst = seg_scales + b * 2 * kSegKb;
#pragma unroll 1  // the producer's 40 registers: one row pair of loads in flight at a time
            for (int h = 0; h < kSegKb / 32; ++h) {
              const int kb = kb0 + 32 * h + lane;
              if (kb < kb_end) {
                dst[32 * h + lane] = __ldg(sb_row0 + kb);
                if constexpr (!C::kUniformScaleB) dst[kSegKb + 32 * h + lane] = __ldg(sb_row1 + kb);
              }
            }
            mbar_arrive(&seg_full[b]);  // every lane: each releases its own stores
          }
          continue;
        }
        if constexpr (C::kOverlap) {
          // The two-set loop's consumers load a tile's first B-scale batch at the tile's start, a DRAM miss
          // after an L2 flush; this thread runs stages ahead of them, so it sends that line (two for a
          // straddling tile) to L2 first: 1.01-1.03x on plans of several short tiles per CTA (128x32768x512,
          // 128x65536x1024), level elsewhere (bench/NOTES.md, twenty-fourth session).
          const auto [sb_row0, sb_row1] = b_scale_rows(p, tile.n_block * kBlockN);
          prefetch_l2(sb_row0 + kb_begin);
          if constexpr (!C::kUniformScaleB) prefetch_l2(sb_row1 + kb_begin);
        }
        for (int kb = kb_begin; kb < kb_end; ++kb, ring.advance()) {
          const int s = ring.stage;
          mbar_wait(&empty[s], ring.phase ^ 1);
          mbar_expect_tx(&full[s], p.tx_bytes);
          if constexpr (C::kAlongN) {  // this CTA's half of A, into both CTAs
            constexpr int kRows = C::kBlockM / kCluster;
            tma_load_2d_multicast(tiles_a + s * C::kABytes + rank * kRows * kBlockK, &map_a, &full[s], kb * kBlockK,
                                  tile.row0 + rank * kRows, (1 << kCluster) - 1);
          } else {
            tma_load_2d(tiles_a + s * C::kABytes, &map_a, &full[s], kb * kBlockK, tile.row0);
          }
          tma_load_2d(scales + s * C::kBlockM, &map_scale, &full[s], tile.row0, kb);
          if constexpr (kCluster > 1 && !C::kAlongN) {  // this CTA's half of B, into both CTAs
            constexpr int kRows = kBlockN / kCluster;
            tma_load_2d_multicast(tiles_b + s * C::kBBytes + rank * kRows * kBlockK, &map_b, &full[s], kb * kBlockK,
                                  tile.n_block * kBlockN + rank * kRows, (1 << kCluster) - 1);
          } else {
            tma_load_2d(tiles_b + s * C::kBBytes, &map_b, &full[s], kb * kBlockK, tile.n_block * kBlockN);
          }
        }
      }
    }
    if (C::kStoreWarp && producer_warp == 2 && !p.partial && !p.out_fp32) {
      // The store warp. Per tile: hand every consumer warpgroup its buffer (once the TMA engine has
      // read the last tile's out of it: one free arrival per tile, matching the consumers' one wait),
      // then wait for each buffer to be written and store it.
      const bool issuer = lane == 0;
      for (int t = first_tile; t < num_tiles; t += tile_stride) {
        const Tile tile = tile_at<kCluster, C::kAlongN, C::kBlockM>(p, t, rank);
        if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the last tile's reads
        __syncwarp();
#pragma unroll
        for (int wg = 0; wg < kConsumers; ++wg) asm volatile("bar.arrive %0, 160;" ::"r"(kEpiFreeBar + wg) : "memory");
#pragma unroll
        for (int wg = 0; wg < kConsumers; ++wg) {
          asm volatile("bar.sync %0, 160;" ::"r"(kEpiFullBar + wg) : "memory");
          if (issuer)
            store_warpgroup_tile<C, kBlockN, kSub>(&map_out, epilogue + wg * kSub * 64 * kBlockN * 2, p, tile.row0,
                                                   tile.n_block * kBlockN, wg);
        }
      }
      if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // shared memory outlives the reads
    }
    if constexpr (kCluster > 1) cluster_sync();  // no CTA leaves while its peer may still write to it
    return;
  }

  // Consumer warpgroups.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(C::kConsumerRegs));
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // K-split warpgroups share rows: k_part picks their K blocks, row_wg their rows.
  const int k_part = kSplitK ? warpgroup : 0;
  const int row_wg = kSplitK ? 0 : warpgroup;
  // Row of this thread in the warpgroup's first slice (and + 8); slice i is 64 i rows further.
  const int row_in_tile = row_wg * 64 * kSub + warp * 16 + lane / 4;
  // Shared-memory addresses formed once, warp-uniform (shuffled from lane 0) so the descriptors live
  // in uniform registers: the issue path per K block is then a few adds, not address conversions.
  const uint32_t a_desc_base = __shfl_sync(~0u, sw128_desc_lo(smem_u32(tiles_a + row_wg * kSub * 64 * kBlockK)), 0);
  const uint32_t b_desc_base = __shfl_sync(~0u, sw128_desc_lo(smem_u32(tiles_b)), 0);
  // 256-row tiles: pinned in a register (the compiler otherwise recomputes it from threadIdx in every
  // K block; the two-accumulator loop has no register to spare for it).
  const uint32_t scale_addr = kSub > 1 ? pinned(smem_u32(scales + row_in_tile)) : smem_u32(scales + row_in_tile);
  const uint32_t seg_scales_addr = smem_u32(seg_scales);
  Ring<kStages> ring;
  int seg = 0;  // B-scale segments read so far
  for (int t = first_tile; t < num_tiles; t += tile_stride) {
    const Tile tile = tile_at<kCluster, C::kAlongN, C::kBlockM>(p, t, rank);
    const int kb_begin = tile.split * p.kb_per_split;
    const int kb_end = min(kb_total, kb_begin + p.kb_per_split);
    const int n_first = tile.n_block * kBlockN;
    const ScaleRows sb_rows = b_scale_rows(p, n_first);  // the two-set loop's B scales
    float total[kSub][C::kAcc], acc[C::kAcc];
#pragma unroll
    for (int i = 0; i < kSub * C::kAcc; ++i) total[i / C::kAcc][i % C::kAcc] = 0.0f;

    // Stage s is free (its scales are in registers already), here and in the cluster peer whose
    // half of the shared A or B tile it also holds.
    auto release = [&](int s) {
      if constexpr (kCluster > 1) {
#pragma unroll
        for (int r = 0; r < kCluster; ++r) mbar_arrive_cluster(&empty[s], r);
      } else {
        mbar_arrive(&empty[s]);
      }
    };
    // One K block of stage s for the warpgroup's 64-row slice `slice`, into a fresh accumulator.
    auto issue = [&](float (&into)[C::kAcc], int s, int slice) {
      const uint32_t a_lo = a_desc_base + s * (C::kABytes >> 4) + slice * (64 * kBlockK >> 4);
      const uint32_t b_lo = b_desc_base + s * (C::kBBytes >> 4);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks)  // K advances 32 bytes inside the 128-byte swizzle atom
        wgmma_e4m3(into, sw128_desc(a_lo + ks * 2), sw128_desc(b_lo + ks * 2), ks > 0);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    };
    // Adds one K block's accumulator to a slice's running total with both scales: the first kFormer
    // 8-column groups take B scale sb0, the rest sb1 (kFormer is a compile-time constant, so there are
    // no per-column selects). Accumulator layout: register 4g + {0,1} is row (lane/4), 4g + {2,3} row
    // (lane/4 + 8).
    auto promote = [&](auto former, float (&into)[C::kAcc], const float (&from)[C::kAcc], float sa_lo, float sa_hi,
                       float sb0, float sb1) {
      constexpr int kFormer = decltype(former)::value;
      const float lo0 = sa_lo * sb0, hi0 = sa_hi * sb0, lo1 = sa_lo * sb1, hi1 = sa_hi * sb1;
#pragma unroll
      for (int g = 0; g < C::kGroups; ++g) {
        const float lo = g < kFormer ? lo0 : lo1, hi = g < kFormer ? hi0 : hi1;
        into[4 * g] += from[4 * g] * lo;
        into[4 * g + 1] += from[4 * g + 1] * lo;
        into[4 * g + 2] += from[4 * g + 2] * hi;
        into[4 * g + 3] += from[4 * g + 3] * hi;
      }
    };
    // One K block of the one-set loop, its B scales given: each slice's block is promoted before the
    // next is issued.
    auto one_block = [&](auto former, int s, float sb0, float sb1) {
#pragma unroll
      for (int slice = 0; slice < kSub; ++slice) {
        issue(acc, s, slice);
        const float sa_lo = lds_f32(scale_addr + s * C::kBlockM * 4 + slice * 256);
        const float sa_hi = lds_f32(scale_addr + s * C::kBlockM * 4 + slice * 256 + 32);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (slice == kSub - 1) {
          if constexpr (C::kLane0Release) {
            __syncwarp();
            if (lane == 0) release(s);
          } else {
            release(s);  // every thread: see the empty barrier's count
          }
        }
        promote(former, total[slice], acc, sa_lo, sa_hi, sb0, sb1);
      }
    };
    // One accumulator set. The B scales come from the segments, each K block's read before its
    // stage is waited for.
    auto mainloop = [&](auto former) {
      constexpr int kFormer = decltype(former)::value;
      for (int kb0 = kb_begin; kb0 < kb_end; kb0 += kSegKb, ++seg) {
        const int b = seg & 1, count = min(kSegKb, kb_end - kb0);
        mbar_wait(&seg_full[b], (seg >> 1) & 1);
        const uint32_t row0 = seg_scales_addr + b * 2 * kSegKb * 4;
        auto step = [&](int i) {
          const float sb0 = lds_f32(row0 + 4 * i);
          const float sb1 = kFormer < C::kGroups ? lds_f32(row0 + kSegKb * 4 + 4 * i) : 0.0f;
          const int s = ring.stage;
          mbar_wait(&full[s], ring.phase);
          one_block(former, s, sb0, sb1);
          ring.advance();
        };
        if (C::kAlwaysUnrolled || count >= kUnrolledMinKb) {  // see Cfg::kAlwaysUnrolled
#pragma unroll 8
          for (int i = 0; i < count; ++i) step(i);
        } else {
#pragma unroll 1
          for (int i = 0; i < count; ++i) step(i);
        }
        mbar_arrive(&seg_empty[b]);  // every thread, after its last read of the segment
      }
    };
    // Up to 128 columns, two accumulator sets fit: K block i + 1 is issued into one while block i's
    // promotion reads the other, so a warpgroup's FFMAs overlap its own tensor-core work. B scales
    // from global memory: one per K block, two for a tile that straddles two scale blocks (96 wide).
    auto mainloop_overlapped = [&](auto former) {
      constexpr bool kStraddles = decltype(former)::value < C::kGroups;
      float acc2[C::kAcc];
      const std::integral_constant<int, 1> one_newer;
      const std::integral_constant<int, 0> none_newer;
      struct Block {
        int s;
        float sb0, sb1;
      };
      // B scales in batches of 32 K blocks, lane i holding block (batch start + i)'s, loaded a batch
      // ahead: a load per K block, one block ahead, left its latency (a DRAM miss on every new
      // line) on the promotion's path; ncu put 16% of the stall samples there on decode shapes.
      auto batch_at = [&](const float* row, int j0) {  // j0: this warpgroup's block count so far
        const int kb = kb_begin + k_part + C::kSplitWG * (j0 + lane);
        return kb < kb_end ? __ldg(row + kb) : 0.0f;
      };
      float batch = batch_at(sb_rows.first, 0), batch_next = batch_at(sb_rows.first, 32);
      float batch1 = 0.0f, batch1_next = 0.0f;  // the second row's, for straddling tiles
      if constexpr (kStraddles) batch1 = batch_at(sb_rows.next, 0), batch1_next = batch_at(sb_rows.next, 32);
      // Block j goes into acc (j even) or acc2 (j odd); named statically by unrolling pairs.
      auto next = [&](float (&into)[C::kAcc], int j, Block& b) {
        b.s = ring.stage;
        if (j % 32 == 0 && j > 0) {
          batch = batch_next, batch_next = batch_at(sb_rows.first, j + 32);
          if constexpr (kStraddles) batch1 = batch1_next, batch1_next = batch_at(sb_rows.next, j + 32);
        }
        b.sb0 = __shfl_sync(~0u, batch, j % 32);
        b.sb1 = kStraddles ? __shfl_sync(~0u, batch1, j % 32) : 0.0f;
        mbar_wait(&full[b.s], ring.phase);
        issue(into, b.s, 0);
#pragma unroll
        for (int w = 0; w < C::kSplitWG; ++w) ring.advance();  // past the other warpgroup's block
      };
      // Promote the block in `from` once at most `in_flight` newer groups remain.
      auto finish = [&](auto in_flight, const float (&from)[C::kAcc], const Block& b) {
        const float sa_lo = lds_f32(scale_addr + b.s * C::kBlockM * 4);
        const float sa_hi = lds_f32(scale_addr + b.s * C::kBlockM * 4 + 32);
        asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(decltype(in_flight)::value) : "memory");
        if (lane == 0) release(b.s);
        promote(former, total[0], from, sa_lo, sa_hi, b.sb0, b.sb1);
      };
      const int n_all = kb_end - kb_begin;
      const int n = (n_all - k_part + C::kSplitWG - 1) / C::kSplitWG;  // this warpgroup's K blocks
      [[maybe_unused]] const Ring<kStages> ring_start = ring;
      if (k_part) ring.advance();
      if (!kSplitK || n > 0) {  // a 1-block split leaves the second warpgroup nothing
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
      if constexpr (kSplitK) ring = ring_start, ring.advance_by(n_all);  // both warpgroups past the tile
    };
    if constexpr (C::kOverlap) with_former<kBlockN>(n_first % kBlockK, mainloop_overlapped);
    else with_former<kBlockN>(n_first % kBlockK, mainloop);
    if constexpr (kSplitK) {  // the second warpgroup's sums into the first's (named barriers 12, 13)
      float* red = reinterpret_cast<float*>(smem + C::kRedOffset);
      const int slot = threadIdx.x % 128;  // the same accumulator layout in both warpgroups
      const bool more = t + tile_stride < num_tiles;
      if (k_part) {
#pragma unroll
        for (int i = 0; i < C::kAcc; ++i) red[i * 128 + slot] = total[0][i];
      }
      asm volatile("bar.sync 12, 256;" ::: "memory");
      if (k_part) {
        if (more) asm volatile("bar.sync 13, 256;" ::: "memory");  // read out before the next tile's writes
        continue;
      }
#pragma unroll
      for (int i = 0; i < C::kAcc; ++i) total[0][i] += red[i * 128 + slot];
      if (more) asm volatile("bar.sync 13, 256;" ::: "memory");
    }

    // Epilogue: register 4g + j holds column 8g + 2 (lane % 4) + (j & 1), row (lane / 4) + 8 (j / 2).
    if constexpr (C::kTmaStore) {
      if (!p.partial && !p.out_fp32) {
        // bf16: stage the warpgroup's 64 kSub x BLOCK_N rows in shared memory as TMA boxes, then one
        // thread (of the warpgroup, or the store warp) hands them to the TMA engine (rows past M,
        // columns past N are clipped by the tensor map) and the warpgroup moves on to its next tile
        // while the copies drain.
        uint8_t* buf = epilogue + row_wg * kSub * 64 * kBlockN * 2;
        const bool issuer = threadIdx.x % 128 == 0;
        if constexpr (C::kStoreWarp) {  // the store warp read the buffer out
          asm volatile("bar.sync %0, 160;" ::"r"(kEpiFreeBar + warpgroup) : "memory");
        } else {
          if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // buffer free again
          asm volatile("bar.sync %0, 128;" ::"r"(1 + warpgroup) : "memory");
        }
        // stmatrix x4 writes four 8 x 8 bf16 matrices whose fragments are the accumulator layout:
        // (group g, rows 0-7), (g, rows 8-15), (g + 1, rows 0-7), (g + 1, rows 8-15); lane l
        // gives the address of row l % 8 of matrix l / 8.
        const int q = lane / 8, r = warp * 16 + (q % 2) * 8 + lane % 8;
        const uint32_t buf_addr = smem_u32(buf);
        // This lane's 16-byte chunk of 8-column group `group` in slice `slice`; conflict-free.
        auto chunk_addr = [&](int slice, int group) -> uint32_t {
          if constexpr (C::kWideStore)  // boxes of all 64 kSub rows x 64 columns, 128-byte rows: chunk ^ row % 8
            return buf_addr + (group / 8) * (kSub * 64 * 128) + (slice * 64 + r) * 128 + (((group % 8) ^ (r % 8)) << 4);
          else  // per slice, 64 x 32 boxes of 64-byte rows: chunk ^ (row / 2) % 4
            return buf_addr + slice * 64 * kBlockN * 2 + (group / 4) * 64 * 64 + r * 64 +
                   (((group % 4) ^ ((r >> 1) & 3)) << 4);
        };
#pragma unroll
        for (int slice = 0; slice < kSub; ++slice) {
          const float* v = total[slice];
#pragma unroll
          for (int g = 0; g < C::kGroups; g += 2)
            stmatrix_x4(chunk_addr(slice, g + q / 2), pack_bf16(v[4 * g], v[4 * g + 1]),
                        pack_bf16(v[4 * g + 2], v[4 * g + 3]), pack_bf16(v[4 * g + 4], v[4 * g + 5]),
                        pack_bf16(v[4 * g + 6], v[4 * g + 7]));
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the TMA engine
        if constexpr (C::kStoreWarp) {  // hand the buffer to the store warp; no wait here
          asm volatile("bar.arrive %0, 160;" ::"r"(kEpiFullBar + warpgroup) : "memory");
          continue;
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + warpgroup) : "memory");
        if (issuer) store_warpgroup_tile<C, kBlockN, kSub>(&map_out, buf, p, tile.row0, n_first, warpgroup);
        continue;
      }
    }
    // fp32 output, split-K partials, narrow bf16 tiles: direct stores. N % 16 == 0, so an 8-column
    // group is wholly inside N or wholly outside.
    const int n0 = n_first + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 2 * kSub; ++i) {  // row (lane / 4) + 8 half of slice i / 2: one row pointer each
      const int slice = i / 2, half = i % 2;
      const int row = tile.row0 + row_in_tile + 64 * slice + 8 * half;
      if (row >= p.m) continue;
      float* row_f32 = p.partial ? p.partial + (int64_t(tile.split) * p.m + row) * p.n
                                 : static_cast<float*>(p.out) + row * p.ldo;  // fp32 out or partials
      __nv_bfloat16* row_bf16 = static_cast<__nv_bfloat16*>(p.out) + row * p.ldo;
      const bool f32 = p.partial || p.out_fp32;
#pragma unroll
      for (int g = 0; g < C::kGroups; ++g) {
        const int col = n0 + 8 * g;
        if (col >= p.n) continue;
        const float x = total[slice][4 * g + 2 * half], y = total[slice][4 * g + 2 * half + 1];
        // Two 4-byte stores, not one float2: an 8-byte store wants x in an even register, which made
        // ptxas give every running total the register parity of its wgmma accumulator, so each
        // promotion FFMA read two operands from one register bank (bench/NOTES.md, nineteenth session).
        if (f32) row_f32[col] = x, row_f32[col + 1] = y;
        else *reinterpret_cast<__nv_bfloat162*>(row_bf16 + col) = __floats2bfloat162_rn(x, y);
      }
    }
  }
  // Shared memory must outlive the last TMA store's reads.
  if (C::kTmaStore && !C::kStoreWarp && threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  if constexpr (kCluster > 1) cluster_sync();
}

}  // namespace fp8gemm_sm90a
