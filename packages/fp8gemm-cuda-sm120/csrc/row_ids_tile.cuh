// Row ids (grouped_gemm with m_indices) in the grouped kernel: the groups are the runs of one id in consecutive rows,
// each cut into row tiles of BM rows from its first row (rows sorted by expert tile as `offs` does), and a run of -1,
// or of any id outside [0, groups), gets no tile. A block finds its row tiles y, y + gridDim.y, ... in one pass over
// the ids: its cursor reads a chunk of kThreads rows (one a thread), two block scans give each row its run's first
// row and each tile start its number, and the cursor moves past a chunk only once no later tile of the block can lie
// in it. Nothing reads the ids on the host; every block computes the same tiles.
#pragma once

#include "fp8gemm/grouped_params.hpp"

namespace fp8gemm_sm120 {

// A block's tile: its group (-1: none), its first row and the group's row end, in the group's view of A/out.
struct GroupTile {
  int group, row0, row_end;
};

// Where a block's walk over the ids stands: the first row of its chunk, the tiles starting before it, and the run
// open at it (first row, id).
struct RowIdsCursor {
  int pos = 0, before = 0, open_start = 0, open_id = 0;
};

// The inclusive scan of every thread's v with op over the block, and the whole block's in `all`. scratch: kWarps
// ints of shared memory, free on entry and on return.
template <int kThreads, class Op>
__device__ __forceinline__ int block_scan(int v, int* scratch, Op op, int& all) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int other = __shfl_up_sync(~0u, v, d);
    if (lane >= d) v = op(v, other);
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  int before = v;
  all = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) all = op(all, scratch[w]);
  for (int w = 0; w < warp; ++w) before = op(scratch[w], before);
  __syncthreads();
  return before;
}

// Row tile y of the row-ids layout (y never decreases between calls with one cursor), {-1, 0, 0} past the last.
// Every thread of the block calls it (it holds barriers); scratch: kThreads / 32 + 2 ints of shared memory that the
// caller does not read or write meanwhile.
template <int BM, int kThreads>
__device__ __forceinline__ GroupTile row_ids_tile(const fp8gemm::GroupedParams& p, int y, RowIdsCursor& c,
                                                  int* scratch) {
  const int32_t* ids = p.group_rows;
  const int m = p.m, tid = threadIdx.x;
  auto max_op = [](int a, int b) { return a < b ? b : a; };
  auto min_op = [](int a, int b) { return a < b ? a : b; };
  auto sum_op = [](int a, int b) { return a + b; };
  while (c.pos < m) {
    const int r = c.pos + tid;
    const int id = r < m ? __ldg(ids + r) : -1;
    const int prev = r == 0 || r > m ? 0 : tid == 0 ? c.open_id : __ldg(ids + r - 1);
    const bool starts = r < m && (r == 0 || id != prev);
    int last_start;
    const int run = max_op(block_scan<kThreads>(starts ? r : -1, scratch, max_op, last_start), c.open_start);
    const bool tile_start = r < m && id >= 0 && id < p.groups && (r - run) % BM == 0;
    int tiles;
    const int after = block_scan<kThreads>(tile_start ? 1 : 0, scratch, sum_op, tiles);  // inclusive
    if (y - c.before < tiles) {  // tile y starts in this chunk: its thread names it, then its run's end in BM rows
      if (tile_start && after - 1 == y - c.before) scratch[0] = r, scratch[1] = id;
      __syncthreads();
      const int row0 = scratch[0], group = scratch[1], cap = min_op(row0 + BM, m);
      __syncthreads();
      int end = cap;
      for (int i = row0 + 1 + tid; i < cap; i += kThreads)
        if (__ldg(ids + i) != group) end = min_op(end, i);
      int first_other;
      block_scan<kThreads>(end, scratch, min_op, first_other);
      return {group, row0, first_other};
    }
    c.before += tiles;
    c.open_start = max_op(last_start, c.open_start);
    const int last = min_op(c.pos + kThreads, m) - 1;
    c.open_id = __ldg(ids + last);
    c.pos += kThreads;
  }
  return {-1, 0, 0};
}

}  // namespace fp8gemm_sm120
