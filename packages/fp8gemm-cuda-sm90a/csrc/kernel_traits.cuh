// Everything one tile configuration (tile_config.hpp) fixes at compile time: warpgroups, pipeline depth,
// register split, the epilogue's path and the shared-memory layout. The why of each choice, with its
// measurements: docs/kernels/sm90a.md.
#pragma once

#include <cstdint>

#include "tile_config.hpp"
#include "tile_order.hpp"

namespace fp8gemm_sm90a {

struct Params {
  void* out;             // [m, n] bf16 or fp32, row stride ldo (elements)
  float* partial;        // split-K: [splits][m][n] fp32, else null
  const float* b_scale;  // K-major: b_scale[(n / 128) * sb_ld + kb]
  int m, n, k;
  int64_t ldo, sb_ld;
  int out_fp32;
  int kb_per_split, splits, m_blocks, n_blocks;
  int tx_bytes;  // bytes per stage, as the tensor maps' boxes give them (launch_tiles.cuh: short_a)
  // The cluster tiles' order (groups of the plan's group_m M blocks for L2 reuse), its divisors computed at launch.
  TileOrder order;
  // Grouped kernels: m is the rows of A's view (M, or M_max when masked); m_blocks is unused (the ring's last run
  // ends the walk; the host bounds the row tiles).
  // Group g's B and B scales are at group coordinate g; its A rows, A scales and out rows at g when masked, else 0.
  const int32_t* group_rows;  // contiguous: cumulative row ends; masked: rows per group (device values, clamped)
  int groups, masked;
  int row_ids;  // grouped: group_rows holds each row's id (m of them): tiles walk its runs (run_ring.cuh)
  int64_t sb_gs, out_gs;  // group strides (elements) of the B scales and of out (masked; k-grouped: per expert)
  int accumulate;         // weight-gradient kernels: out += the product (else out = it)
  int store_tma;          // weight-gradient kernels: out through map_out's TMA stores (its dtype's epilogue; else direct)
  // K-grouped weight-gradient kernels: split e is expert e of `groups`, its K blocks from group_rows (the cumulative
  // token ends) and its out at e * out_gs (scheduler.cuh expert_k_range).
};

// The most experts a k-grouped weight-gradient launch takes: their clamped token ends sit in shared memory
// (fp8gemm::kKGroupedMaxExperts, asserted equal in wgrad_launch.cuh).
constexpr int kKGroupedExperts = 2048;

// Grouped kernels: the runs in flight from the run warp to the roles (run_ring.cuh), in smem.red.
constexpr int kRunSlots = 32;
constexpr int kRunRingBytes = kRunSlots * (2 * 8 + 4 * 4);

// B-scale segments: the B scales of up to kSegKb K blocks of a tile (two 128-row blocks of N), double
// buffered, behind a full and an empty barrier each.
constexpr int kSegKb = 64;
constexpr int kSegBytes = 4 * 8 + 2 * 2 * kSegKb * 4;

__host__ __device__ constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// Pipeline depth: as many stages as shared memory holds next to the epilogue buffer (tma_store) and `extra`
// bytes, at most `cap`. Weight-gradient kernels: B scales per column in every stage.
constexpr int stages_for(int block_m, int block_n, int extra, int cap, bool wgrad, bool tma_store) {
  const int per_stage = block_m * kBlockK + block_n * kBlockK + block_m * 4 + (wgrad ? block_n * 4 : 0);
  const int epilogue = tma_store ? block_m * block_n * 2 : 0;
  const int fit = (227 * 1024 - 2048 - epilogue - 2 * cap * 8 - kSegBytes - extra) / per_stage;  // 2048: alignment; barriers
  return fit < cap ? fit : cap;
}

// A TMA box of fp32 scales starts and spans whole 16 bytes in its inner dimension (M): 4 rows.
__host__ __device__ constexpr int round_up_to_4_rows(int rows) { return (rows + 3) & ~3; }

template <int kRows, int kCols, int kCluster, MainLoop kLoop, GemmType kGemm = GemmType::kDense>
struct KernelTraits {
  static constexpr GemmType kType = kGemm;
  static constexpr int kBlockM = kRows, kBlockN = kCols;
  // kSub: 64-row slices per consumer warpgroup; 256-row tiles are two warpgroups of two slices, multiplied
  // one after the other into one accumulator set.
  static constexpr int kSub = kRows == 256 ? 2 : 1;
  static constexpr int kConsumers = kRows / 64 / kSub;  // consumer warpgroups along M
  static constexpr bool kSplitK = kLoop == MainLoop::kSplitWarpgroups;
  // Two accumulator sets (the two-set and split loops) fit the registers up to 128 columns and 2 consumers.
  static constexpr bool kOverlap = kLoop != MainLoop::kOneSet;
  static_assert(!kOverlap || (kBlockN <= kBlockK && kConsumers <= 2 && kSub == 1),
                "two accumulator sets: up to 128 columns, two warpgroups of one slice");
  // K split over warpgroups: two consumer warpgroups on the same 64 rows, each taking every other K
  // block; the second hands its sums to the first through shared memory (kRedBytes) at the tile's end.
  // Its pipeline gets up to 20 stages, as the loads must keep up with two consumers.
  static constexpr int kSplitWG = kSplitK ? 2 : 1;
  // The weight-gradient GEMM: every stage also holds the B scales of the tile's columns (TMA, as A's), each thread
  // promoting its accumulator columns with their own; out through TMA (kF32TmaStore, kTmaStore) or direct stores.
  // One-set loop only.
  static constexpr bool kWgrad = kGemm == GemmType::kWgrad || kGemm == GemmType::kKGroupedWgrad;
  // k-grouped: split e is expert e, its K blocks from the token ends each CTA copies into shared memory first.
  static constexpr bool kKGrouped = kGemm == GemmType::kKGroupedWgrad;
  static_assert(!kWgrad || (!kOverlap && kCluster == 1) || (!kOverlap && pairs_along_n(kRows)),
                "weight-gradient kernels: the one-set loop; clusters pair N blocks (each CTA its own B scales)");
  static constexpr int kConsumerWGs = kConsumers * kSplitWG;
  // The split warpgroup's sums; k-grouped weight-gradient kernels: the experts' token ends (no stage less); grouped
  // kernels: the row-id runs' ring (no stage less either).
  static constexpr int kRedBytes = kSplitK     ? 128 * (kBlockN / 2) * 4
                                   : kKGrouped ? kKGroupedExperts * 4
                                   : kGemm == GemmType::kGrouped ? kRunRingBytes : 0;
  // bf16 epilogue through shared memory and TMA stores; of the weight-gradient tiles the one-GEMM ones of two
  // warpgroups and the k-grouped 128 x 128 one, whose few K blocks per tile left the L2 busy with the direct epilogue's
  // 4-byte stores (192 rows: it spilled).
  static constexpr bool kTmaStore =
      kBlockN % 32 == 0 &&
      (!kWgrad || (kKGrouped ? kBlockM == 128 && kBlockN % 64 == 0 : kConsumers == 2 && kSub == 1));
  // Weight-gradient tiles of two warpgroups of one slice: fp32 out through the epilogue buffer and TMA stores, or TMA's
  // reduce-add with p.accumulate (epilogue.cuh epilogue_f32_tma), in rounds of the boxes the buffer holds. The 192-row
  // tile (152 registers a thread) spilled in its main loop with it.
  static constexpr bool kF32TmaStore = kWgrad && kSub == 1 && kConsumers == 2 && kBlockN % 32 == 0;
  static constexpr int kStages =
      stages_for(kBlockM, kBlockN, kRedBytes, kSplitK ? 20 : 12, kWgrad, kTmaStore || kF32TmaStore);
  static_assert(!kSplitK || (kConsumers == 1 && kSub == 1 && kCluster == 1 && kBlockN <= kBlockK),
                "K split over warpgroups: 64-row two-set tiles");
  static_assert(kStages >= 3, "at least three pipeline stages");
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs");
  static_assert(kRows % 64 == 0 && kRows <= 256, "BLOCK_M: 64, 128, 192 or 256 rows");
  // 2-CTA clusters pair tiles along N, sharing (multicasting) the A tile, or along M, sharing B.
  static constexpr bool kAlongN = kCluster > 1 && pairs_along_n(kRows);
  static_assert(kBlockN >= 16 && kBlockN <= 192 && kBlockN % 16 == 0, "BLOCK_N: a multiple of 16 up to 192");
  // A tile takes the B scales of at most two 128-wide blocks (its furthest start into one is 128 -
  // gcd(BLOCK_N, 128)): 176, starting 112 columns in, would reach into a third.
  static_assert(kBlockK - gcd(kBlockN, kBlockK) + kBlockN <= 2 * kBlockK,
                "BLOCK_N: tiles straddle at most two scale blocks");
  static_assert(kSub == 1 || (kSub == 2 && kBlockN <= kBlockK), "two slices per warpgroup: up to 128 columns");
  static constexpr int kAcc = kBlockN / 2;                        // fp32 accumulators per thread (m64nNk32)
  static constexpr int kGroups = kBlockN / 8;                     // 8-column groups: accumulators 4g .. 4g + 3
  static constexpr bool kUniformScaleB = kBlockK % kBlockN == 0;  // no tile straddles two scale blocks
  // The one-set loop reads its B scales from shared-memory segments that a producer warp fills ahead;
  // the two-set loop loads them itself, in batches of 32 K blocks.
  static constexpr bool kSegmentScalesB = !kOverlap && !kWgrad;
  // Boxes of 64 columns (128-byte rows, 128-byte swizzle) spanning a warpgroup's rows: 2 TMA stores
  // per warpgroup of a 256 x 128 tile instead of 8 (32-wide tiles keep 64 x 32 boxes).
  static constexpr bool kWideStore = kBlockN % 64 == 0;
  // 256-row tiles hand their epilogue buffer to a producer warp that issues the TMA stores and waits
  // for them, so no consumer warp lags behind its warpgroup into the next tile's first wgmma.
  static constexpr bool kStoreWarp = kTmaStore && kSub == 2;
  static_assert(!(kKGrouped && kStoreWarp), "the store warp stores at the tile's a_group, not the k-grouped expert");
  static_assert(kType == GemmType::kDense || (!kSplitK && (kCluster == 1 || kAlongN)),
                "grouped kernels: no K split; clusters pair N blocks (one group's rows)");
  // The one-set loop's stage release: one arrive per consumer warp (lane 0's) on 256-row tiles, one per
  // thread elsewhere; the two-set loop: per warp.
  // Weight-gradient tiles with two running totals per warpgroup, or three warpgroups, read their B scales inside the
  // promotion (no registers to hold them across the wgmma) and release the stage after it, one arrive per warp.
  static constexpr bool kWgradLateRelease = kWgrad && (kSub > 1 || kConsumers > 2 || kBlockN > 160);
  static constexpr bool kLane0Release = kSub == 2 || kWgradLateRelease;
  // The one-set loop unrolled 8 times on 256-row tiles; the other one-set tiles run the unrolled copy
  // only on segments of at least kUnrolledMinKb K blocks, a rolled one below.
  static constexpr bool kAlwaysUnrolled = kSub == 2;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  // 64-row tiles issue their TMA loads from an elected lane of the producer's first warp instead of
  // lane 0: ptxas then knows one thread runs the loop and drops the per-TMA uniformity loop
  // (ELECT + BRA.U.ANY) around each UTMALDG.
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
  static constexpr int kSBBytes = kWgrad ? kBlockN * 4 : 0;  // the B scales of a stage (weight-gradient kernels)
  // [A x stages][B x stages][A scales x stages][epilogue][full bars][empty bars][B-scale segment bars,
  // segments][warpgroup sums]; tiles 1024-byte aligned (SW128). bf16 output leaves through shared memory
  // and TMA stores (the swizzle keeps the stmatrix writes from the accumulator layout conflict-free).
  static constexpr int kEpiBytes = kTmaStore || kF32TmaStore ? kBlockM * kBlockN * 2 : 0;
  static constexpr int kEpiOffset = (kStages * (kABytes + kBBytes + kSBytes + kSBBytes) + 1023) / 1024 * 1024;  // SW128
  static constexpr int kBarOffset = kEpiOffset + kEpiBytes;
  static constexpr int kSegOffset = kBarOffset + 2 * kStages * 8;
  static constexpr int kRedOffset = kSegOffset + kSegBytes;
  static constexpr int kSmemBytes = kRedOffset + kRedBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "Hopper allows 227 KB of shared memory per block");
};

// Named barriers of the store-warp epilogue (the per-warpgroup ones are 1 + warpgroup; the warpgroup
// K split's hand-over uses 12 and 13).
constexpr int kEpiFullBar = 4, kEpiFreeBar = 8;
// The k-grouped weight-gradient kernels' token ends, written (gemm_kernel.cuh) before the consumers read them.
constexpr int kExpertEndsBar = 14;

// The kernel's shared memory, carved from the dynamic allocation (1024-byte aligned for SW128).
template <class C>
struct SharedStorage {
  uint8_t* tiles_a;    // [stage][BLOCK_M][128] FP8
  uint8_t* tiles_b;    // [stage][BLOCK_N][128] FP8
  float* scales;       // [stage][BLOCK_M] A scales
  float* b_scales;     // [stage][BLOCK_N] B scales per column (weight-gradient kernels)
  uint8_t* epilogue;   // bf16 tile buffer for the TMA stores
  uint64_t* full;      // per stage: loaded (the TMA thread's arrival with the byte count)
  uint64_t* empty;     // per stage: released by the consumers
  uint64_t* seg_full;  // per B-scale segment buffer: written by the B-scale warp
  uint64_t* seg_empty;
  float* seg_scales;  // [buffer][row][kSegKb]
  float* red;         // the split warpgroup's sums (k-grouped weight-gradient kernels: int32 token ends per expert)

  __device__ __forceinline__ explicit SharedStorage(uint8_t* smem)
      : tiles_a(smem),
        tiles_b(smem + C::kStages * C::kABytes),
        scales(reinterpret_cast<float*>(smem + C::kStages * (C::kABytes + C::kBBytes))),
        b_scales(scales + C::kStages * C::kBlockM),
        epilogue(smem + C::kEpiOffset),
        full(reinterpret_cast<uint64_t*>(smem + C::kBarOffset)),
        empty(full + C::kStages),
        seg_full(reinterpret_cast<uint64_t*>(smem + C::kSegOffset)),
        seg_empty(seg_full + 2),
        seg_scales(reinterpret_cast<float*>(seg_empty + 2)),
        red(reinterpret_cast<float*>(smem + C::kRedOffset)) {}
};

}  // namespace fp8gemm_sm90a
