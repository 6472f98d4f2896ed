// The split-K policy every arch shares: when a shape's output tiles cannot fill the GPU's units (SMs,
// CUs), K is split into fp32 partials that a reduction launch sums, until about one wave of work items
// runs. An arch parameterises it with the fewest K blocks a split keeps and whether the last wave may
// overshoot the units. Plain C++ without the standard library's algorithms (gfx942 compiles it with a
// bare clang in HIP mode).
#pragma once
#include <cstdint>

#include "fp8gemm/ceil_div.hpp"

namespace fp8gemm {

struct SplitKPolicy {
  int min_kb_per_split;  // a split keeps at least this many 128-wide K blocks (when K has them)
  bool fill_units;       // splits = ceil(units / tiles) (>= one wave), else floor (<= one wave)
};

struct SplitK {
  int splits;        // >= 1, no empty split
  int kb_per_split;  // K blocks per split; the last split may hold fewer
};

// kb_total K blocks in `splits` splits of equal size, the last one shorter: no empty split.
constexpr SplitK split_evenly(int kb_total, int splits) {
  const int per = splits > 0 && kb_total > 0 ? static_cast<int>(ceil_div(kb_total, splits)) : 1;
  return {kb_total > 0 ? static_cast<int>(ceil_div(kb_total, per)) : 1, per};
}

// The splits for `tiles` output tiles (work items without a split) on `units` units.
constexpr SplitK split_k(int64_t tiles, int kb_total, int units, SplitKPolicy policy) {
  int splits = 1;
  if (tiles > 0 && tiles < units) {
    const int64_t want = policy.fill_units ? ceil_div(units, tiles) : units / tiles;
    const int most = kb_total / policy.min_kb_per_split > 1 ? kb_total / policy.min_kb_per_split : 1;
    splits = static_cast<int>(want < 1 ? 1 : (want > most ? most : want));
  }
  return split_evenly(kb_total, splits);
}

// The fp32 partials of a split plan ([splits][m][n]); 0 without a split.
constexpr int64_t split_workspace_bytes(int splits, int64_t m, int64_t n) {
  return splits > 1 ? int64_t(splits) * m * n * int64_t(sizeof(float)) : 0;
}

}  // namespace fp8gemm
