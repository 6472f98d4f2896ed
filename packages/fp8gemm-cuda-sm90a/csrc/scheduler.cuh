// The persistent tile scheduler: which (m block, n block, K split) the t-th cluster tile of a CTA is
// (the order itself: tile_order.hpp), and the pipeline position the producer and consumers advance.
#pragma once

#include "group_cursor.hpp"
#include "kernel_traits.cuh"
#include "ptx.cuh"
#include "run_ring.cuh"

namespace fp8gemm_sm90a {

struct Tile {
  int m_block, n_block, split;
  int row0;  // first row of A and of the output it covers (see tile_at)
  // Grouped kernels: the group (B's coordinate), A's and out's group coordinate (the group when masked, else 0),
  // and the rows [lo, hi) the tile stores. Dense tiles: 0, 0 and all rows.
  int group = 0, a_group = 0, lo = 0, hi = 0;
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
  // the rows TMA loads are real: TMA fills rows past the end far slower than it loads real ones. It
  // recomputes rows of the block before it, and stores them again with identical values. The start
  // is rounded up to 4 rows (at most 3 past M), since a TMA box must start 16-byte aligned in its
  // inner dimension, M for the A scales (an illegal instruction otherwise). A tile taller than M
  // loads boxes of its M rows instead (launch_tiles.cuh).
  tile.row0 = min(tile.m_block * kBlockM, round_up_to_4_rows(max(p.m - kBlockM, 0)));
  return tile;
}

// Grouped kernels: whether warpgroup row_wg's rows of the tile all lie outside the rows it stores (a group smaller
// than the tile: that warpgroup's products would be thrown away, so it skips them and the tile costs what its rows do).
template <class C>
__device__ __forceinline__ bool idle_rows(const Tile& tile, int row_wg) {
  if constexpr (C::kType != GemmType::kGrouped) return false;
  const int first = tile.row0 + row_wg * C::kSub * 64;
  return first >= tile.hi || first + C::kSub * 64 <= tile.lo;
}

// Every role's source of tiles: tile_at for one GEMM, the group cursor over the runs of the ring for grouped kernels
// (`every_lane`: how a role releases the ring's slots, run_ring.cuh RunReader). `more(t)` first (false once a grouped
// walk is past the last run's tiles; always true for one GEMM), then `at(t)`.
template <class C, int kCluster>
struct Tiles {
  GroupCursor<C::kBlockM, kCluster> cursor;
  RunReader runs;
  __device__ __forceinline__ Tiles(const SharedStorage<C>& smem, bool every_lane) : runs(smem.red, every_lane) {}
  __device__ __forceinline__ bool more(const Params& p, int t) {
    if constexpr (C::kType == GemmType::kGrouped)
      return cursor.seek_runs(p, t, [&] { return runs.next(); });
    else return true;
  }
  __device__ __forceinline__ Tile at(const Params& p, int t, int rank) const {
    if constexpr (C::kType == GemmType::kGrouped) {
      const GroupTile g = cursor.tile(p, t);
      Tile tile;
      tile.m_block = g.m_block, tile.n_block = g.n_block * kCluster + rank, tile.split = 0, tile.row0 = g.row0;
      tile.group = g.group, tile.a_group = p.masked ? g.group : 0, tile.lo = g.lo, tile.hi = g.hi;
      return tile;
    } else {
      return tile_at<kCluster, C::kAlongN, C::kBlockM>(p, t, rank);
    }
  }
};

// The CTA's walk over its cluster tiles: first_tile, first_tile + stride, ... below count (grouped kernels: no bound,
// so every role takes every run out of the ring, up to its end, and the run warp never waits on a slot no one
// releases; the host checks t stays below 2^31 over its bound on the row tiles per N block).
struct TileWalk {
  int first, stride, count;
};
template <class C, int kCluster>
__device__ __forceinline__ TileWalk tile_walk(const Params& p) {
  TileWalk walk;
  walk.count = C::kType == GemmType::kGrouped
                   ? 0x7fffffff
                   : m_groups_of<kCluster, C::kAlongN>(p) * n_groups_of<kCluster, C::kAlongN>(p) * p.splits;
  walk.first = blockIdx.x / kCluster, walk.stride = gridDim.x / kCluster;
  return walk;
}

// The K blocks [begin, end) of a tile's split.
struct KRange {
  int begin, end;
};
__device__ __forceinline__ KRange k_range(const Params& p, const Tile& tile, int kb_total) {
  const int begin = tile.split * p.kb_per_split;
  return {begin, min(kb_total, begin + p.kb_per_split)};
}

// K-grouped weight-gradient kernels: each CTA's copy of the experts' token ends, offs clamped to [previous end, the
// layout's token bound] (fp8gemm/backend.hpp KGroupedWgradArgs), written by the producer's first warp (the lanes load
// and clamp every end, then take the running maximum 32 at a time) before any role reads them.
__device__ __forceinline__ void load_expert_ends(int* ends, const Params& p, int lane) {
  const int bound = p.k - kBlockK * p.groups - 1;  // the most tokens the layout holds (k = 128 (E + M / 128 + 1))
#pragma unroll 1
  for (int e = lane; e < p.groups; e += 32) ends[e] = min(max(__ldg(p.group_rows + e), 0), bound);
  __syncwarp();
  int carry = 0;
#pragma unroll 1
  for (int first = 0; first < p.groups; first += 32) {
    const int e = first + lane;
    int end = max(e < p.groups ? ends[e] : 0, carry);
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int before = __shfl_up_sync(~0u, end, d);
      if (lane >= d) end = max(end, before);
    }
    if (e < p.groups) ends[e] = end;
    carry = __shfl_sync(~0u, end, 31);
  }
  __syncwarp();
}

// The K blocks of expert `tile.split` (k-grouped weight-gradient kernels): its tokens' whole 128-column blocks from
// block e + start / 128 of the per-expert aligned layout, none for an expert without tokens.
__device__ __forceinline__ KRange expert_k_range(uint32_t ends, const Tile& tile) {
  const int e = tile.split, start = e ? lds_s32(ends + 4 * (e - 1)) : 0;  // shared loads: no generic pointer held
  const int begin = e + start / kBlockK;
  return {begin, begin + (lds_s32(ends + 4 * e) - start + kBlockK - 1) / kBlockK};
}

// A tile's K blocks: its split's, or its expert's in a k-grouped weight-gradient kernel (the ends in smem.red).
template <class C>
__device__ __forceinline__ KRange tile_k_range(const SharedStorage<C>& smem, const Params& p, const Tile& tile,
                                               int kb_total) {
  if constexpr (C::kKGrouped) return expert_k_range(smem_u32(smem.red), tile);
  else return k_range(p, tile, kb_total);
}

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

}  // namespace fp8gemm_sm90a
