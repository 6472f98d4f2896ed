// The producer warpgroup (the kernel's last). Warp 0: the TMA thread, filling the stage ring with A, B and
// A's scales. Warp 1 (one-set loop): the B-scale warp, writing each tile's B scales into shared-memory
// segments ahead of the consumers (a warp of its own, so its lanes load a segment's scales at once: one
// load latency per segment). Warp 2 (256-row tiles): the store warp, issuing the consumers' TMA stores. Warp 3
// (grouped kernels): the run warp, handing out the groups with rows or the runs of row ids (run_ring.cuh).
#pragma once

#include "epilogue.cuh"
#include "ptx.cuh"
#include "scheduler.cuh"

namespace fp8gemm_sm90a {

// The B-scale warp: per tile, segments of kSegKb K blocks into the double buffer (every lane).
template <class C>
__device__ __forceinline__ void write_scale_segments(const SharedStorage<C>& smem, const Params& p, const Tile& tile,
                                                     KRange k, int lane, int& seg) {
  // A tile whose width does not divide 128 may straddle two scale blocks.
  const auto [sb_row0, sb_row1] = b_scale_rows<C>(p, tile, tile.n_block * C::kBlockN);
  for (int kb0 = k.begin; kb0 < k.end; kb0 += kSegKb, ++seg) {
    const int b = seg & 1;
    mbar_wait(&smem.seg_empty[b], ((seg >> 1) & 1) ^ 1);  // a fresh barrier passes the first round
    float* dst = smem.seg_scales + b * 2 * kSegKb;
#pragma unroll 1  // the producer's 40 registers: one row pair of loads in flight at a time
    for (int h = 0; h < kSegKb / 32; ++h) {
      const int kb = kb0 + 32 * h + lane;
      if (kb < k.end) {
        dst[32 * h + lane] = __ldg(sb_row0 + kb);
        if constexpr (!C::kUniformScaleB) dst[kSegKb + 32 * h + lane] = __ldg(sb_row1 + kb);
      }
    }
    mbar_arrive(&smem.seg_full[b]);  // every lane: each releases its own stores
  }
}

// The TMA thread: one tile's K blocks into the stage ring.
template <class C, int kCluster>
__device__ __forceinline__ void load_tile(const SharedStorage<C>& smem, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                          const CUtensorMap* map_scale, const CUtensorMap* map_b_scale, const Params& p,
                                          const Tile& tile, KRange k, int rank, Ring<C::kStages>& ring) {
  constexpr int kBlockN = C::kBlockN;
  if constexpr (C::kOverlap) {
    // The two-set loop's consumers load a tile's first B-scale batch at the tile's start, a DRAM miss
    // after an L2 flush; this thread runs stages ahead of them, so it sends that line (two for a
    // straddling tile) to L2 first.
    const auto [sb_row0, sb_row1] = b_scale_rows<C>(p, tile, tile.n_block * kBlockN);
    prefetch_l2(sb_row0 + k.begin);
    if constexpr (!C::kUniformScaleB) prefetch_l2(sb_row1 + k.begin);
  }
  for (int kb = k.begin; kb < k.end; ++kb, ring.advance()) {
    const int s = ring.stage;
    mbar_wait(&smem.empty[s], ring.phase ^ 1);
    mbar_expect_tx(&smem.full[s], p.tx_bytes);
    if constexpr (C::kType == GemmType::kGrouped) {  // 3-D maps: the group is the third coordinate
      if constexpr (C::kAlongN) {  // this CTA's half of A (both CTAs' tiles are one row tile), into both CTAs
        constexpr int kRows = C::kBlockM / kCluster;
        tma_load_3d_multicast(smem.tiles_a + s * C::kABytes + rank * kRows * kBlockK, map_a, &smem.full[s],
                              kb * kBlockK, tile.row0 + rank * kRows, tile.a_group, (1 << kCluster) - 1);
      } else {
        tma_load_3d(smem.tiles_a + s * C::kABytes, map_a, &smem.full[s], kb * kBlockK, tile.row0, tile.a_group);
      }
      tma_load_3d(smem.scales + s * C::kBlockM, map_scale, &smem.full[s], tile.row0, kb, tile.a_group);
      tma_load_3d(smem.tiles_b + s * C::kBBytes, map_b, &smem.full[s], kb * kBlockK, tile.n_block * kBlockN, tile.group);
      continue;
    }
    if constexpr (C::kAlongN) {  // this CTA's half of A, into both CTAs
      constexpr int kRows = C::kBlockM / kCluster;
      tma_load_2d_multicast(smem.tiles_a + s * C::kABytes + rank * kRows * kBlockK, map_a, &smem.full[s], kb * kBlockK,
                            tile.row0 + rank * kRows, (1 << kCluster) - 1);
    } else {
      tma_load_2d(smem.tiles_a + s * C::kABytes, map_a, &smem.full[s], kb * kBlockK, tile.row0);
    }
    tma_load_2d(smem.scales + s * C::kBlockM, map_scale, &smem.full[s], tile.row0, kb);
    if constexpr (C::kWgrad)  // the tile's columns' B scales of this K block (MN-major: one row per K block)
      tma_load_2d(smem.b_scales + s * kBlockN, map_b_scale, &smem.full[s], tile.n_block * kBlockN, kb);
    if constexpr (kCluster > 1 && !C::kAlongN) {  // this CTA's half of B, into both CTAs
      constexpr int kRows = kBlockN / kCluster;
      tma_load_2d_multicast(smem.tiles_b + s * C::kBBytes + rank * kRows * kBlockK, map_b, &smem.full[s], kb * kBlockK,
                            tile.n_block * kBlockN + rank * kRows, (1 << kCluster) - 1);
    } else {
      tma_load_2d(smem.tiles_b + s * C::kBBytes, map_b, &smem.full[s], kb * kBlockK, tile.n_block * kBlockN);
    }
  }
}

// The store warp. Per tile: hand every consumer warpgroup its buffer (once the TMA engine has read the
// last tile's out of it: one free arrival per tile, matching the consumers' one wait), then wait for
// each buffer to be written and store it.
template <class C, int kCluster>
__device__ __forceinline__ void store_tiles(const SharedStorage<C>& smem, const CUtensorMap* map_out, const Params& p,
                                            TileWalk walk, int rank, int lane) {
  const bool issuer = lane == 0;
  Tiles<C, kCluster> tiles(smem, true);
  for (int t = walk.first; t < walk.count; t += walk.stride) {
    if (!tiles.more(p, t)) break;
    const Tile tile = tiles.at(p, t, rank);
    if (issuer) tma_store_wait_read();  // the last tile's reads
    __syncwarp();
#pragma unroll
    for (int wg = 0; wg < C::kConsumers; ++wg) named_bar_arrive<160>(kEpiFreeBar + wg);
#pragma unroll
    for (int wg = 0; wg < C::kConsumers; ++wg) {
      named_bar_sync<160>(kEpiFullBar + wg);
      const uint8_t* buf = smem.epilogue + wg * C::kSub * 64 * C::kBlockN * 2;
      if constexpr (C::kType == GemmType::kGrouped) {  // its warpgroup copied a box crossing the group's end
        if (!box_in_group<C>(tile, tile.row0 + wg * C::kSub * 64)) continue;
      }
      if (issuer)
        store_warpgroup_tile<C, C::kBlockN, C::kSub>(map_out, buf, p, tile.row0, tile.n_block * C::kBlockN, wg,
                                                     tile.a_group);
    }
  }
  if (issuer) tma_store_wait_read();  // shared memory outlives the reads
}

template <class C, int kCluster>
__device__ __forceinline__ void run_producer(const SharedStorage<C>& smem, const CUtensorMap* map_a,
                                             const CUtensorMap* map_b, const CUtensorMap* map_scale,
                                             const CUtensorMap* map_out, const CUtensorMap* map_b_scale, const Params& p,
                                             TileWalk walk, int rank, int kb_total) {
  regs_decrease<C::kProducerRegs>();
  const int producer_warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  if constexpr (C::kType == GemmType::kGrouped) {
    if (producer_warp == 3) {
      if (p.row_ids) scan_runs(smem.red, p, lane);
      else scan_groups(smem.red, p, lane);
      return;
    }
  }
  const bool tma_thread = producer_warp == 0 && (C::kElectedProducer ? elect_one() : lane == 0);
  if (tma_thread || (C::kSegmentScalesB && producer_warp == 1)) {
    Ring<C::kStages> ring;
    int seg = 0;  // B-scale segments written so far
    Tiles<C, kCluster> tiles(smem, true);
    for (int t = walk.first; t < walk.count; t += walk.stride) {
      if (!tiles.more(p, t)) break;
      const Tile tile = tiles.at(p, t, rank);
      const KRange k = tile_k_range(smem, p, tile, kb_total);
      if (C::kSegmentScalesB && producer_warp == 1) {
        write_scale_segments(smem, p, tile, k, lane, seg);
        continue;
      }
      load_tile<C, kCluster>(smem, map_a, map_b, map_scale, map_b_scale, p, tile, k, rank, ring);
    }
  }
  if constexpr (C::kStoreWarp)
    if (producer_warp == 2 && !p.partial && !p.out_fp32) store_tiles<C, kCluster>(smem, map_out, p, walk, rank, lane);
}

}  // namespace fp8gemm_sm90a
