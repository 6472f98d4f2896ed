// The row-ids layout's runs (maximal stretches of consecutive rows with one id), as the run warp (run_ring.cuh) finds
// them 32 rows at a time: lane l of a chunk holds row base + l, and the warp's ballots join the lanes. Plain C++ per
// lane, so a host driver runs the same arithmetic with the ballots computed in a loop
// (tests/test_sm90a_grouped_row_ids.py).
//
// A run starts at row 0 and wherever a row's id differs from the row before; row m closes the last one. A lane whose
// row starts a run (or is row m) closes the run before it, which is handed out, numbered in row order, when its id
// lies in [0, groups): runs of -1, or of any other id outside B, get no tiles and are never written.
#pragma once
#include <cstdint>

#include "group_cursor.hpp"

namespace fp8gemm_sm90a {

FP8GEMM_SM90A_HD int highest_bit(uint32_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(x);
#else
  return 31 - __builtin_clz(x);
#endif
}

FP8GEMM_SM90A_HD int bit_count(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// One lane's row: `bound` where it starts a run or is row m, `closes` where the run ending there is handed out.
// prev: the id of the row before (any value for row 0).
struct RunLane {
  bool bound, closes, starts;  // starts: bound and a row of A (the run open after the chunk starts at the last such)
};
FP8GEMM_SM90A_HD RunLane run_lane(int row, int m, int id, int prev, int groups) {
  const bool starts = row < m && (row == 0 || id != prev);
  const bool bound = starts || row == m;
  return {bound, bound && row > 0 && prev >= 0 && prev < groups, starts};
}

// The run a closing lane hands out: from the chunk's previous boundary, else from `open`, the run open when the
// chunk began; ending at the lane's row, with the id of the row before it.
FP8GEMM_SM90A_HD RowRun closed_run(uint32_t bounds, int lane, int base, int open, int prev) {
  const uint32_t below = bounds & ((1u << lane) - 1);
  return {below ? base + highest_bit(below) : open, base + lane, prev};
}

// Its number among the runs handed out: `emitted` before the chunk, then those of the chunk's lanes below it.
FP8GEMM_SM90A_HD int run_number(uint32_t emits, int lane, int emitted) {
  return emitted + bit_count(emits & ((1u << lane) - 1));
}

// The `offs` and `masked_m` layouts as runs (run_ring.cuh scan_groups), 32 groups a chunk, lane l holding group base + l:
// a group's rows end at its value clamped to [0, m]; contiguous groups also begin at the previous group's end and end
// no earlier (the running maximum of the clamped ends, which the warp takes by shuffles), masked ones begin at 0. A
// group with rows is a run with its own id: the same rows GroupCursor::next_group gives, without a read per group.
FP8GEMM_SM90A_HD int clamped_rows(int rows, int m) { return rows < 0 ? 0 : rows > m ? m : rows; }

// Where the run open after the chunk starts: its last run start (`starts`: the lanes' ballot), else the one before.
FP8GEMM_SM90A_HD int open_after(uint32_t starts, int base, int open) {
  return starts ? base + highest_bit(starts) : open;
}

}  // namespace fp8gemm_sm90a
