// The row-ids layout's runs (maximal stretches of consecutive rows with one id), as the run warp (run_ring.cuh) finds
// them 32 rows at a time: lane l of a chunk holds row base + l, and the warp's ballots join the lanes. Plain C++ per
// lane, so a host driver runs the same arithmetic with the ballots computed in a loop
// (tests/test_sm90a_grouped_row_ids.py).
//
// A run starts at row 0 and wherever a row's id differs from the row before; row m closes the last one. A lane whose
// row starts a run (or is row m) closes the run before it, which is handed out, numbered in row order, when its id
// lies in [0, groups): runs of -1, or of any other id outside B, get no tiles and are never written. A long run also
// goes out in pieces while the scan is still inside it (scan_row_runs), so tiles start before its end is found.
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

FP8GEMM_SM90A_HD int larger(int a, int b) {
#if defined(__CUDA_ARCH__)
  return max(a, b);
#else
  return a < b ? b : a;
#endif
}

// A loop pragma for the device compiler (FP8GEMM_SM90A_PRAGMA(unroll 1)); the host's has none to take.
#if defined(__CUDA_ARCH__)
#define FP8GEMM_SM90A_PRAGMA(x) _Pragma(#x)
#else
#define FP8GEMM_SM90A_PRAGMA(x)
#endif

// The run warp's scan for `offs` (contiguous) and `masked_m` (run_ring.cuh scan_groups), one lane's part: every group
// with rows handed to put_run(n, run) as run n, in group order, then the end (run {0, 0, -1}, from lane 0). p: the
// launch's group_rows, groups, m and masked. Warp: the lane's load (ldg) and the warp's collectives (shfl_up, shfl,
// ballot, sync), CUDA's intrinsics on the device, one thread per lane in tests/test_sm90a_grouped_walk.py.
template <class Warp, class P, class PutRun>
FP8GEMM_SM90A_HD void scan_group_ends(const P& p, int lane, PutRun&& put_run) {
  constexpr int kBatch = 8;    // chunks of 32 groups whose loads are in flight together
  int carry = 0, emitted = 0;  // the previous chunk's last clamped end (contiguous), the runs handed out
  FP8GEMM_SM90A_PRAGMA(unroll 1)
  for (int g0 = 0; g0 < p.groups; g0 += 32 * kBatch) {
    int rows[kBatch];
    FP8GEMM_SM90A_PRAGMA(unroll)
    for (int j = 0; j < kBatch; ++j) {
      const int g = g0 + 32 * j + lane;
      rows[j] = g < p.groups ? Warp::ldg(p.group_rows + g) : 0;
    }
    FP8GEMM_SM90A_PRAGMA(unroll)
    for (int j = 0; j < kBatch; ++j) {
      const int g = g0 + 32 * j + lane;
      if (g0 + 32 * j >= p.groups) break;  // warp-uniform
      int end = clamped_rows(rows[j], p.m), begin = 0;
      if (!p.masked) {  // warp-uniform
        end = larger(end, carry);
        FP8GEMM_SM90A_PRAGMA(unroll)
        for (int d = 1; d < 32; d *= 2) {
          const int below = Warp::shfl_up(end, d);
          if (lane >= d) end = larger(end, below);
        }
        const int up = Warp::shfl_up(end, 1);
        begin = lane ? up : carry;
        carry = Warp::shfl(end, 31);
      }
      const bool has_rows = g < p.groups && end > begin;
      const uint32_t emits = Warp::ballot(has_rows);
      if (has_rows) put_run(run_number(emits, lane, emitted), RowRun{begin, end, g});
      Warp::sync();
      emitted += bit_count(emits);
    }
  }
  if (lane == 0) put_run(emitted, RowRun{0, 0, -1});
}

// Where the run open after the chunk starts: its last run start (`starts`: the lanes' ballot), else the one before.
FP8GEMM_SM90A_HD int open_after(uint32_t starts, int base, int open) {
  return starts ? base + highest_bit(starts) : open;
}

// A run still open after `seen` rows goes out in pieces of whole multiples of 768 rows from its start rounded down to
// 4 (where GroupCursor starts its tiles): 768 is a multiple of every grouped tile's rows (64, 128, 192, 256), so the
// pieces take exactly the tiles of the whole run, and no CTA's first tile waits for the scan to reach a long first
// run's end (the time saved was not measured apart from the H200's clock drift).
constexpr int kRunPieceAlign = 768;
constexpr int kRunPieceRows = 2 * kRunPieceAlign;  // the shortest piece: a dozen 128-row tiles per N block

// Where the piece of the run open at `open` ends, given its rows up to `seen`; `open` where no piece is due yet.
FP8GEMM_SM90A_HD int run_piece_end(int open, int seen) {
  const int first = open & ~3, whole = (seen - first) / kRunPieceAlign * kRunPieceAlign;
  return whole >= kRunPieceRows ? first + whole : open;
}

// The run warp's scan of the row-ids layout (run_ring.cuh scan_runs), one lane's part: every run of m_indices (the
// launch's group_rows, m rows) handed to put_run(n, run) as run n, in row order, long runs in pieces, then the end
// (run {0, 0, -1}, from lane 0). Warp: as scan_group_ends takes it (tests/test_sm90a_grouped_row_ids.py runs it on
// 32 host threads).
template <class Warp, class P, class PutRun>
FP8GEMM_SM90A_HD void scan_row_runs(const P& p, int lane, PutRun&& put_run) {
  constexpr int kBatch = 8;  // chunks of 32 rows whose loads are in flight together
  const int m = p.m;
  int open = 0, open_id = 0, emitted = 0;  // the run open at the chunk's start, its id, the runs handed out
  FP8GEMM_SM90A_PRAGMA(unroll 1)
  for (int r0 = 0; r0 <= m; r0 += 32 * kBatch) {
    int ids[kBatch];
    FP8GEMM_SM90A_PRAGMA(unroll)
    for (int j = 0; j < kBatch; ++j) {
      const int row = r0 + 32 * j + lane;
      ids[j] = row < m ? Warp::ldg(p.group_rows + row) : -1;
    }
    FP8GEMM_SM90A_PRAGMA(unroll)
    for (int j = 0; j < kBatch; ++j) {
      const int base = r0 + 32 * j, row = base + lane, id = ids[j];
      if (base > m) break;  // warp-uniform
      const int up = Warp::shfl_up(id, 1), prev = lane ? up : open_id;
      const RunLane l = run_lane(row, m, id, prev, p.groups);
      const uint32_t bounds = Warp::ballot(l.bound), emits = Warp::ballot(l.closes), starts = Warp::ballot(l.starts);
      if (l.closes) put_run(run_number(emits, lane, emitted), closed_run(bounds, lane, base, open, prev));
      Warp::sync();
      emitted += bit_count(emits);
      open = open_after(starts, base, open);
      open_id = Warp::shfl(id, 31);
    }
    // Every row below `seen` read, and row seen - 1 (lane 31's last) in the open run: a piece of it may go out.
    const int seen = r0 + 32 * kBatch, end = run_piece_end(open, seen);
    if (seen < m && open_id >= 0 && open_id < p.groups && end > open) {  // warp-uniform
      if (lane == 0) put_run(emitted, RowRun{open, end, open_id});
      Warp::sync();
      ++emitted, open = end;
    }
  }
  if (lane == 0) put_run(emitted, RowRun{0, 0, -1});
}

}  // namespace fp8gemm_sm90a
