// Grouped FP8 block-scaled GEMMs for gfx942 (mixture of experts), all groups in one launch:
//
// out_g[r, n] = sum_kb a_scale_g[r, kb] * b_scale_g[n / 128, kb] * sum_{k in kb} a_g[r, k] * b_g[n, k]
//
// The grid is N tiles x row tiles of every group. Each workgroup finds its group and row range on the device from
// group_rows (clamped here: the host never sees them), then runs tile.hpp's main loop and masked store, the dense
// kernel's, on that group's A, B, scales and out. A tile's rows end at its group's end, so it never writes another
// group's rows; workgroups past the last tile return at once.
#include "hip_compat.hpp"
#include "launch.hpp"
#include "tile.hpp"

namespace fp8gemm_gfx942 {

// A workgroup's tile: its group (-1: none), its first row and the group's row end, in the group's view of A/out.
struct GroupTile {
  int group, row0, row_end;
};

__device__ inline int clamp_rows(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

// Contiguous: row tile y in the order of the groups, found by a scan of the ends, each clamped to [previous end,
// m] so the groups never overlap or leave A. Empty groups add no tiles; the scan stops at the tile's group.
template <int BM>
__device__ inline GroupTile contiguous_tile(const GroupedParams& p, int y) {
  int begin = 0, first_tile = 0;
  for (int g = 0; g < p.groups; ++g) {
    const int end = clamp_rows(p.group_rows[g], begin, p.m);
    const int tiles = (end - begin + BM - 1) / BM;
    if (y < first_tile + tiles) return {g, begin + (y - first_tile) * BM, end};
    first_tile += tiles;
    begin = end;
  }
  return {-1, 0, 0};
}

// Masked: tiles_per_group row tiles per group; those at or past the group's rows (clamped to [0, M_max]) are idle.
template <int BM>
__device__ inline GroupTile masked_tile(const GroupedParams& p, int y) {
  const int g = y / p.tiles_per_group, row0 = (y % p.tiles_per_group) * BM;
  const int rows = clamp_rows(p.group_rows[g], 0, p.m);
  return row0 < rows ? GroupTile{g, row0, rows} : GroupTile{-1, 0, 0};
}

template <class C>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void grouped_kernel(const GroupedParams p) {
  __shared__ TileLds<C> lds;
  const int y = __builtin_amdgcn_workgroup_id_y();
  const GroupTile gt = p.masked ? masked_tile<C::kBlockM>(p, y) : contiguous_tile<C::kBlockM>(p, y);
  if (gt.group < 0) return;  // the same for the whole workgroup, before any barrier
  const int64_t g = gt.group;

  TileArgs t;
  t.a = p.a + g * p.a_gs, t.b = p.b + g * p.b_gs, t.a_scale = p.a_scale + g * p.sa_gs;
  t.lda = p.lda, t.ldb = p.ldb, t.sa_ld = p.sa_ld;
  t.n0 = __builtin_amdgcn_workgroup_id_x() * kBlockN, t.n = p.n;
  t.row0 = gt.row0, t.row_end = gt.row_end;
  t.b_scale_row = p.b_scale + g * p.sb_gs + int64_t(t.n0 / kBlockN) * p.sb_ld;
  t.kb_begin = 0, t.kb_count = p.k / kBlockK;

  TileAcc<C> total;
  tile_mainloop<C>(t, lds, total);
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

int enqueue_grouped(const GroupedParams& p, const GroupedGeometry& g, void* stream) {
  return g.config == TileConfig::M128 ? enqueue_grouped_tiles<Cfg128>(p, g, stream)
                                      : enqueue_grouped_tiles<Cfg32>(p, g, stream);
}

}  // namespace fp8gemm_gfx942
