// Shape policy and launch geometry for the gfx942 kernel, in one place. Host-only C++, so the unit
// tests call the same code (through _C.plan) that launch() uses.
#pragma once
#include <cstdint>

namespace fp8gemm_gfx942 {

constexpr int kBlockN = 128;  // = scale block: one b_scale per tile and K block
constexpr int kBlockK = 128;  // = scale block: one promotion per 128 of K
constexpr int kThreads = 256;  // 4 wavefronts of 64

enum class TileConfig { M32, M128 };

struct Geometry {
  TileConfig config;
  int block_m;
  int grid_x, grid_y, grid_z;  // N tiles, M tiles, K splits
  int kb_per_split;
  int64_t workspace_bytes;  // split-K fp32 partials; 0 without split
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// (no <algorithm>: this header is also compiled by a bare clang in HIP mode, without wrappers)
inline int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Decode-sized M (<= 32) gets 32-row tiles; when the tiles cannot fill the CUs (MI300X: 304), K is
// split until about one wave of workgroups runs, with >= 4 K blocks (512 of K) per split.
inline Geometry geometry(int64_t m, int64_t n, int64_t k, int cu_count) {
  Geometry g{};
  g.config = m <= 32 ? TileConfig::M32 : TileConfig::M128;
  g.block_m = m <= 32 ? 32 : 128;
  g.grid_x = static_cast<int>(ceil_div(n, kBlockN));
  g.grid_y = static_cast<int>(ceil_div(m, g.block_m));
  const int kb_total = static_cast<int>(k / kBlockK);
  const int64_t tiles = int64_t(g.grid_x) * g.grid_y;
  int splits = 1;
  if (tiles < cu_count) splits = static_cast<int>(clamp(ceil_div(cu_count, tiles), 1, kb_total / 4 > 1 ? kb_total / 4 : 1));
  g.kb_per_split = static_cast<int>(ceil_div(kb_total, splits));
  g.grid_z = static_cast<int>(ceil_div(kb_total, g.kb_per_split));  // no empty split
  g.workspace_bytes = g.grid_z > 1 ? int64_t(g.grid_z) * m * n * int64_t(sizeof(float)) : 0;
  return g;
}

}  // namespace fp8gemm_gfx942
