// FP8 block-scaled GEMM for Hopper (sm_90a): TMA + mbarrier pipeline, warp specialisation, wgmma.
//
// out[m, n] = sum_kb a_scale[m, kb] * b_scale[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// A persistent grid walks (m block, n block, K split) tiles (scheduler.cuh). Per CTA, one producer
// warpgroup (producer.cuh) fills a ring of stages, each holding one 128-wide K block of A, B and A's
// scales; the consumer warpgroups multiply a stage with four wgmma m64nNk32 per 64-row slice into a fresh
// fp32 accumulator, release the stage, and promote the accumulator into the slice's running total with
// both scales (the tensor core's FP8 accumulation is not full fp32, so it never runs for more than 128 of
// K): mainloop_two_set.cuh or mainloop_one_set.cuh, by the tile's MainLoop. Then epilogue.cuh.
// With kCluster = 2, two CTAs of a cluster share (multicast) one operand; with kCluster = 1 the launch may
// still pair CTAs in 2-CTA clusters for placement only: the kernel never addresses its peer.
// Grouped kernels (kType = GemmType::kGrouped, grouped.cu) are the same kernel on 3-D tensor maps whose third
// coordinate is the group, walking the groups' tiles (scheduler.cuh GroupCursor); a warpgroup whose rows cross
// its group's end stores directly, masked to the group's rows. The producer's last warp hands out the groups with
// rows (or the runs of m_indices) through a ring in shared memory (run_ring.cuh), which the roles walk.
// Weight-gradient kernels (kType = GemmType::kWgrad, wgrad_launch.cuh) take B scales per column (map_b_scale, one
// row of them per stage; the others get any valid map there and never read it), promote each column with its own
// (consumer.cuh promote_columns) and store fp32 out through TMA (reduce-adds where p.accumulate says so; the 192-row
// tile stores directly); k-grouped ones (GemmType::kKGroupedWgrad) take split e as expert e, out through a 3-D map.
// The parts and their choices: docs/kernels/sm90a-structure.md.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "epilogue.cuh"
#include "kernel_traits.cuh"
#include "mainloop_one_set.cuh"
#include "mainloop_two_set.cuh"
#include "producer.cuh"
#include "scheduler.cuh"

namespace fp8gemm_sm90a {

template <int kRows, int kCols, int kCluster, MainLoop kLoop, GemmType kType = GemmType::kDense>
__global__ void __launch_bounds__(KernelTraits<kRows, kCols, kCluster, kLoop, kType>::kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                const __grid_constant__ CUtensorMap map_scale, const __grid_constant__ CUtensorMap map_out,
                const __grid_constant__ CUtensorMap map_b_scale, const Params p) {
  using C = KernelTraits<kRows, kCols, kCluster, kLoop, kType>;
  constexpr int kStages = C::kStages, kSub = C::kSub, kBlockN = C::kBlockN;
  extern __shared__ uint8_t smem_raw[];
  const SharedStorage<C> smem(
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023)));

  const int warpgroup = threadIdx.x / 128;
  const int kb_total = p.k / kBlockK;
  const TileWalk walk = tile_walk<C, kCluster>(p);
  const int rank = kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&smem.full[s], 1);  // the TMA thread's, with the byte count
      // One arrival per consumer warp (per thread: see kLane0Release) of every CTA whose half lands here.
      mbar_init(&smem.empty[s], kCluster * C::kConsumers * (!C::kOverlap && !C::kLane0Release ? 128 : 4));
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(&smem.seg_full[b], 32);                    // every lane of the B-scale warp
      mbar_init(&smem.seg_empty[b], C::kConsumers * 128);  // every consumer thread, after its last read
    }
    if constexpr (kType == GemmType::kGrouped) init_run_ring<C>(smem.red, p);
    mbar_init_fence();
  }
  if (threadIdx.x == C::kConsumerWGs * 128) {  // descriptors into the cache while the barriers settle
    prefetch_map(&map_a);
    prefetch_map(&map_b);
    prefetch_map(&map_scale);
    prefetch_map(&map_out);
    if constexpr (C::kWgrad) prefetch_map(&map_b_scale);
  }
  if constexpr (kCluster > 1) cluster_sync();  // peers' barriers exist before anyone signals them
  else __syncthreads();
  wait_prior_grid();  // launched early (programmatic): everything above overlapped the previous grid

  // K-grouped: the token ends (offs may come from the previous grid) from the producer's first warp to every role.
  constexpr int kEndsBarThreads = C::kConsumerWGs * 128 + 32;
  if (warpgroup == C::kConsumerWGs) {
    if constexpr (C::kKGrouped) {
      if (threadIdx.x / 32 % 4 == 0) {
        load_expert_ends(reinterpret_cast<int*>(smem.red), p, threadIdx.x % 32);
        named_bar_arrive<kEndsBarThreads>(kExpertEndsBar);
      }
    }
    run_producer<C, kCluster>(smem, &map_a, &map_b, &map_scale, &map_out, &map_b_scale, p, walk, rank, kb_total);
    if constexpr (kCluster > 1) cluster_sync();  // no CTA leaves while its peer may still write to it
    return;
  }

  // Consumer warpgroups.
  regs_increase<C::kConsumerRegs>();
  if constexpr (C::kKGrouped) named_bar_sync<kEndsBarThreads>(kExpertEndsBar);
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // K-split warpgroups share rows: k_part picks their K blocks, row_wg their rows.
  const int k_part = C::kSplitK ? warpgroup : 0;
  const int row_wg = C::kSplitK ? 0 : warpgroup;
  // Row of this thread in the warpgroup's first slice (and + 8); slice i is 64 i rows further.
  const int row_in_tile = row_wg * 64 * kSub + warp * 16 + lane / 4;
  // Shared-memory addresses formed once, warp-uniform (shuffled from lane 0) so the descriptors live
  // in uniform registers: the issue path per K block is then a few adds, not address conversions.
  const uint32_t a_desc_base = __shfl_sync(~0u, sw128_desc_lo(smem_u32(smem.tiles_a + row_wg * kSub * 64 * kBlockK)), 0);
  const uint32_t b_desc_base = __shfl_sync(~0u, sw128_desc_lo(smem_u32(smem.tiles_b)), 0);
  // 256-row tiles: pinned in a register (the compiler otherwise recomputes it from threadIdx in every
  // K block; the two-accumulator loop has no register to spare for it).
  const uint32_t scale_addr =
      kSub > 1 ? pinned(smem_u32(smem.scales + row_in_tile)) : smem_u32(smem.scales + row_in_tile);
  Consumer<C, kCluster> consumer{smem, a_desc_base, b_desc_base, scale_addr, smem_u32(smem.seg_scales),
                                smem_u32(smem.b_scales + 2 * (lane % 4)), lane, k_part};
  Tiles<C, kCluster> tiles(smem, false);
  for (int t = walk.first; t < walk.count; t += walk.stride) {
    if (!tiles.more(p, t)) break;
    const Tile tile = tiles.at(p, t, rank);
    const KRange k = tile_k_range(smem, p, tile, kb_total);
    if (C::kKGrouped && p.accumulate && k.end == k.begin) continue;  // an expert without tokens keeps its out
    const int n_first = tile.n_block * kBlockN;
    const ScaleRows sb_rows = b_scale_rows<C>(p, tile, n_first);  // the two-set loop's B scales
    float total[kSub][C::kAcc];
#pragma unroll
    for (int i = 0; i < kSub * C::kAcc; ++i) total[i / C::kAcc][i % C::kAcc] = 0.0f;

    if constexpr (C::kOverlap)
      with_former<kBlockN>(n_first % kBlockK, [&](auto former) { mainloop_two_set(consumer, former, k, sb_rows, total); });
    else if constexpr (C::kWgrad)
      mainloop_one_set_columns(consumer, std::integral_constant<int, C::kGroups>(), k, total);
    else
      with_former<kBlockN>(n_first % kBlockK, [&](auto former) {
        mainloop_one_set(consumer, former, k, total, !idle_rows<C>(tile, row_wg));
      });
    if constexpr (C::kSplitK) {
      if (!gather_split_sums<C>(smem.red, k_part != 0, t + walk.stride < walk.count, total[0])) continue;
    }

    if constexpr (C::kTmaStore) {
      if (!p.partial && !p.out_fp32 && (!C::kWgrad || p.store_tma)) {
        epilogue_tma<C>(&map_out, smem.epilogue, p, tile, warpgroup, row_wg, warp, lane, total);
        continue;
      }
    }
    if constexpr (C::kF32TmaStore) {  // a last M block started early adds its rows of the block before directly
      if (p.out_fp32 && p.store_tma && !(p.accumulate && tile.row0 != tile.m_block * C::kBlockM)) {
        epilogue_f32_tma<C>(&map_out, smem.epilogue, p, tile, total);
        continue;
      }
    }
    if (C::kWgrad && p.accumulate && p.out_fp32)
      epilogue_direct<C, C::kWgrad>(p, tile, row_in_tile, lane, total);
    else
      epilogue_direct<C>(p, tile, row_in_tile, lane, total);
  }
  // Shared memory must outlive the last TMA store's reads.
  if ((C::kTmaStore || C::kF32TmaStore) && !C::kStoreWarp && threadIdx.x % 128 == 0) tma_store_wait_read();
  if constexpr (kCluster > 1) cluster_sync();
}

}  // namespace fp8gemm_sm90a
