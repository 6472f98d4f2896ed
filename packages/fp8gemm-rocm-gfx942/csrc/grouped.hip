// Grouped FP8 block-scaled GEMMs for gfx942 (mixture of experts), all groups in one launch:
//
// out_g[r, n] = sum_kb a_scale_g[r, kb] * b_scale_g[n / 128, kb] * sum_{k in kb} a_g[r, k] * b_g[n, k]
//
// The grid is N tiles x row tiles of every group. Each workgroup finds its group and row range on the device from
// group_rows (clamped here: the host never sees them), then runs tile.hpp's main loop and masked store, the dense
// kernel's, on that group's A, B, scales and out. A tile's rows end at its group's end, so it never writes another
// group's rows; workgroups past the last tile return at once. Row ids (one id per row, any order): the groups are the
// runs of one id in consecutive rows, found by the whole workgroup in one read of the ids per pass.
#include "contiguous_tile.hpp"
#include "hip_compat.hpp"
#include "launch.hpp"
#include "tile.hpp"

namespace fp8gemm_gfx942 {

__device__ inline int clamp_rows(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

// Contiguous: contiguous_tile.hpp (each wavefront scans the group ends with cross-lane reads).

// Masked: tiles_per_group row tiles per group; those at or past the group's rows (clamped to [0, M_max]) are idle.
template <int BM>
__device__ inline GroupTile masked_tile(const GroupedParams& p, int y) {
  const int g = y / p.tiles_per_group, row0 = (y % p.tiles_per_group) * BM;
  const int rows = clamp_rows(p.group_rows[g], 0, p.m);
  return row0 < rows ? GroupTile{g, row0, rows} : GroupTile{-1, 0, 0};
}

// Row ids: what the workgroup's scans share; it overlays the tile's LDS, which the main loop fills only after it.
struct RowIdsLds {
  int last_start[2][kThreads];   // scan buffers: the last run start in each thread's chunk (prefix maximum)
  int first_start[2][kThreads];  // the first run start in each chunk (suffix minimum)
  int tiles[2][kThreads];        // the tiles starting in each chunk (prefix sum)
  GroupTile found;
};

template <class C>
union GroupedLds {
  TileLds<C> tile;
  RowIdsLds row_ids;
};

__device__ inline int max_int(int a, int b) { return a < b ? b : a; }
__device__ inline int min_int(int a, int b) { return a < b ? a : b; }

// The scan of every thread's `value` with `op` over the threads before it (kReverse: after it), `none` for the
// first (last) thread; Hillis-Steele with two buffers, one barrier a step.
template <bool kReverse, class Op>
__device__ inline int exclusive_scan(int (&buf)[2][kThreads], int value, int none, Op op) {
  const int tid = thread_id();
  int src = 0;
  buf[src][tid] = value;
  block_sync();
  for (int step = 1; step < kThreads; step <<= 1) {
    const int other = kReverse ? tid + step : tid - step;
    if (other >= 0 && other < kThreads) value = op(value, buf[src][other]);
    buf[src ^ 1][tid] = value;
    src ^= 1;
    block_sync();
  }
  const int other = kReverse ? tid + 1 : tid - 1;
  return other >= 0 && other < kThreads ? buf[src][other] : none;
}

// Row ids: row tile y in row order, over the runs of one id in consecutive rows. A run of an id in [0, groups) is cut
// into tiles of BM rows from its first row (sorted ids tile as the contiguous layout does); any other id (-1, or
// out of range) gets none. Each thread reads a chunk of ceil(m / kThreads) rows per pass; three scans join the
// chunks: the run open at each chunk's start, the first run start after it, the tiles before it. Every work-item
// calls it (it holds barriers); the thread whose chunk holds tile y's first row reports the tile.
template <int BM>
__device__ inline GroupTile row_ids_tile(const GroupedParams& p, int y, RowIdsLds& s) {
  const int32_t* ids = p.group_rows;
  const int tid = thread_id(), m = p.m, chunk = (m + kThreads - 1) / kThreads;
  const int begin = min_int(tid * chunk, m), end = begin + min_int(chunk, m - begin);  // tid * chunk < m + kThreads
  // Calls visit(row, id, run) for each row of the chunk, run the row where its run starts (open: the one before the
  // chunk), until visit returns true.
  auto walk = [&](int open, auto&& visit) {
    int prev = begin > 0 && begin < end ? ids[begin - 1] : 0;
    for (int r = begin, run = open; r < end; ++r) {
      const int id = ids[r];
      if (r == 0 || id != prev) run = r;
      if (visit(r, id, run)) return;
      prev = id;
    }
  };
  int first = m, last = -1;  // the chunk's first and last run starts
  walk(-1, [&](int r, int, int run) {
    if (run == r) first = min_int(first, r), last = r;
    return false;
  });
  const int open_run = exclusive_scan<false>(s.last_start, last, -1, max_int);  // thread 0: row 0 starts a run
  const int next_run = exclusive_scan<true>(s.first_start, first, m, min_int);
  // A tile starts at a row whose id is a group's, a multiple of BM rows into its run.
  auto tile_start = [&](int r, int id, int run) { return id >= 0 && id < p.groups && (r - run) % BM == 0; };
  int count = 0;
  walk(open_run, [&](int r, int id, int run) {
    count += tile_start(r, id, run);
    return false;
  });
  if (tid == 0) s.found = GroupTile{-1, 0, 0};  // the scan's barriers order it before any report
  const int before = exclusive_scan<false>(s.tiles, count, 0, [](int a, int b) { return a + b; });
  if (y >= before && y - before < count) {  // tile y starts in this chunk: find it, then where its run ends
    int skip = y - before, row0 = begin;
    walk(open_run, [&](int r, int id, int run) {
      row0 = r;
      return tile_start(r, id, run) && skip-- == 0;
    });
    const int group = ids[row0];
    int run_end = next_run;
    for (int r = row0 + 1; r < end; ++r)
      if (ids[r] != group) {
        run_end = r;
        break;
      }
    s.found = GroupTile{group, row0, min_int(row0 + BM, run_end)};
  }
  block_sync();
  const GroupTile found = s.found;
  block_sync();  // everyone has read it before the main loop writes this LDS
  return found;
}

template <class C>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void grouped_kernel(const GroupedParams p) {
  __shared__ GroupedLds<C> lds;
  const int y = __builtin_amdgcn_workgroup_id_y();
  const GroupTile gt = p.row_ids  ? row_ids_tile<C::kBlockM>(p, y, lds.row_ids)
                       : p.masked ? masked_tile<C::kBlockM>(p, y)
                                  : contiguous_tile<C::kBlockM>(p, y);
  if (gt.group < 0) return;  // the same for the whole workgroup, before the main loop's barriers
  const int64_t g = gt.group;

  TileArgs t;
  t.a = p.a + g * p.a_gs, t.b = p.b + g * p.b_gs, t.a_scale = p.a_scale + g * p.sa_gs;
  t.lda = p.lda, t.ldb = p.ldb, t.sa_ld = p.sa_ld;
  t.n0 = __builtin_amdgcn_workgroup_id_x() * kBlockN, t.n = p.n;
  t.row0 = gt.row0, t.row_end = gt.row_end;
  t.b_scale_row = p.b_scale + g * p.sb_gs + int64_t(t.n0 / kBlockN) * p.sb_ld;
  t.kb_begin = 0, t.kb_count = p.k / kBlockK;

  TileAcc<C> total;
  tile_mainloop<C>(t, lds.tile, total);
  void* out = static_cast<uint8_t*>(p.out) + g * p.out_gs * (p.out_fp32 ? 4 : 2);
  tile_store<C>(total, t.row0, t.row_end, t.n0, p.n,
                [&](int row, int col, float x) { store_out(out, p.ldo, p.out_fp32, row, col, x); });
}

template <class C>
int enqueue_grouped_tiles(const GroupedParams& p, const GroupedGeometry& g, void* stream) {
  void* args[] = {const_cast<GroupedParams*>(&p)};
  return hipLaunchKernel(reinterpret_cast<const void*>(&grouped_kernel<C>),
                         dim3(static_cast<unsigned>(g.grid_x), static_cast<unsigned>(g.grid_y)), dim3(kThreads), args,
                         0, static_cast<hipStream_t>(stream));
}

static_assert(sizeof(RowIdsLds) <= sizeof(TileLds<Cfg32>), "the row-id scans add no LDS to either tile config");

int enqueue_grouped(const GroupedParams& p, const GroupedGeometry& g, void* stream) {
  return g.config == TileConfig::M128 ? enqueue_grouped_tiles<Cfg128>(p, g, stream)
                                      : enqueue_grouped_tiles<Cfg32>(p, g, stream);
}

}  // namespace fp8gemm_gfx942
