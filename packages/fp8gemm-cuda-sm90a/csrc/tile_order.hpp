// The persistent grid's tile order (scheduler.cuh tile_at): which K split, M group and N group the t-th cluster
// tile is. Plain C++, so the host computes the order's divisors once per launch and tests check it without a GPU.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FP8GEMM_SM90A_HD __host__ __device__ __forceinline__
#else
#define FP8GEMM_SM90A_HD inline
#endif

namespace fp8gemm_sm90a {

// Division by a divisor fixed at launch as a multiply-high and a shift, the magic number computed on the host (as
// CUTLASS's FastDivmod). The tile order sits on the TMA thread's path to its first load, where each 32-bit division
// by a runtime value is a dependent chain of ~20 instructions (I2F, MUFU.RCP, F2I, corrections): three of them made
// that path 174 instructions long in the 64 x 64 kernel, 117 without (measured 1.02-1.05x where CTAs take several short tiles).
struct FastDiv {
  uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDiv() = default;
  // Exact for dividends below 2^31 (tile counts).
  explicit FastDiv(uint32_t d) : divisor(d) {
    if (d > 1) {
      uint32_t ceil_log2 = 0;
      while ((uint64_t(1) << ceil_log2) < d) ++ceil_log2;
      const uint32_t p = 31 + ceil_log2;
      multiplier = static_cast<uint32_t>(((uint64_t(1) << p) + d - 1) / d);
      shift = p - 32;
    }
  }
  FP8GEMM_SM90A_HD uint32_t div(uint32_t n) const {
    return divisor == 1 ? n : static_cast<uint32_t>((uint64_t(n) * multiplier) >> 32) >> shift;
  }
};

// Cluster tiles are walked split by split; within a split, in groups of group_m M groups (the last group may hold
// fewer), M fastest inside a group.
struct TileOrder {
  FastDiv per_split, group_tiles, rows_full, rows_last;
  int m_groups, group_m;
};

inline TileOrder make_tile_order(int m_groups, int n_groups, int group_m) {
  TileOrder o;
  o.per_split = FastDiv(m_groups * n_groups);
  o.group_tiles = FastDiv(group_m * n_groups);
  o.rows_full = FastDiv(group_m);
  o.rows_last = FastDiv(m_groups - (m_groups - 1) / group_m * group_m);
  o.m_groups = m_groups, o.group_m = group_m;
  return o;
}

struct TileIndex {
  int split, m, n;  // K split, M group, N group
};

FP8GEMM_SM90A_HD TileIndex tile_index(const TileOrder& o, int t) {
  uint32_t u = t;
  TileIndex i;
  i.split = o.per_split.div(u);
  u -= i.split * o.per_split.divisor;
  const uint32_t group = o.group_tiles.div(u);
  u -= group * o.group_tiles.divisor;
  const int first_m = group * o.group_m;
  const FastDiv& rows = first_m + o.group_m >= o.m_groups ? o.rows_last : o.rows_full;  // this group's M groups
  i.n = rows.div(u);
  i.m = first_m + (u - i.n * rows.divisor);
  return i;
}

}  // namespace fp8gemm_sm90a
