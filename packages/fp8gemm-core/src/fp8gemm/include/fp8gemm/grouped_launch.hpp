// The grouped launch's host-side checks every arch makes before touching the device: the layouts and the sizes its
// kernels take. A refusal is a std::invalid_argument (a ValueError in Python) worded
// "<package>: grouped_launch: <what>". Host code only (plain C++: gfx942's launch.cpp includes it too).
#pragma once
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// Sizes and tile indices are ints on the device, and an index plus one tile (at most 256 rows) must not overflow.
constexpr int64_t kGroupedMaxSize = int64_t{INT_MAX} - 256;

[[noreturn]] inline void refuse_grouped(const char* package, const std::string& what) {
  throw std::invalid_argument(std::string(package) + ": grouped_launch: " + what);
}

// Whether the launch has output to write (m, n and groups all non-zero); refuses a layout other than contiguous,
// masked and, where the arch's kernel walks them (`row_ids`), row ids, and an m, n, k or groups outside
// [0, 2^31 - 256). group_rows is the device's to clamp.
inline bool grouped_launch_has_work(const GroupedArgs& a, const char* package, bool row_ids = false) {
  if (a.layout != kGroupedContiguous && a.layout != kGroupedMasked && (!row_ids || a.layout != kGroupedRowIds))
    refuse_grouped(package, "layout " + std::to_string(a.layout) + " is not supported (" +
                                (row_ids ? "contiguous, masked and row ids are)" : "contiguous and masked are)"));
  for (const int64_t size : {a.m, a.n, a.k, a.groups})
    if (size < 0 || size > kGroupedMaxSize)
      refuse_grouped(package, "m = " + std::to_string(a.m) + ", n = " + std::to_string(a.n) + ", k = " +
                                  std::to_string(a.k) + ", groups = " + std::to_string(a.groups) +
                                  ": each must lie in [0, 2^31 - 256)");
  return a.m > 0 && a.n > 0 && a.groups > 0;
}

// The plan's tiles, counted in ints on the device: row_tiles x n_tiles, plus `overshoot` (the tile indices a
// persistent grid steps past the last tile), must stay below 2^31.
inline void check_grouped_tiles(int64_t row_tiles, int64_t n_tiles, int64_t overshoot, const char* package) {
  if (n_tiles > 0 && row_tiles > (INT_MAX - overshoot) / n_tiles)
    refuse_grouped(package, std::to_string(row_tiles) + " x " + std::to_string(n_tiles) +
                                " tiles: one launch takes fewer than 2^31");
}

// grouped_workspace_bytes of an arch whose grouped launch needs no workspace (no split-K): define_grouped_entry's
// default (fp8gemm/backend_module.hpp).
inline int64_t no_grouped_workspace(int, int64_t, int64_t, int64_t, int64_t) { return 0; }

}  // namespace fp8gemm
