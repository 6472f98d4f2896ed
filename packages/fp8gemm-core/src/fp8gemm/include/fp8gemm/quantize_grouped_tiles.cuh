// Quantization of rows sorted by expert with their per-expert transpose, the algorithm every arch shares
// (fp8gemm/backend.hpp QuantizeGroupedTransposedArgs), bit-identical to fp8gemm.training.quantize_grouped_with_transpose's
// reference (docs/training.md "Mixture-of-experts layers"). One workgroup per (column block of q_t, K block): the
// column block finds on the device which expert's tokens it holds (expert_columns: each end of offs clamped to
// [previous end, m], expert e's tokens from column block e + start_e / 128), reads those rows of x once and writes
// them through quantize_tiles.cuh's tile: q and its 1 x 128 scales for those rows, the q_t block with one scale per
// column. A gap block reads nothing and writes zero codes with the all-zero block's scale. Rows past the last end
// belong to no column block: the column-block indices past q_t's (`blocks` ..) take them, 128 at a time, and write q
// alone. No value of offs reaches outside the tensors: the rows a block reads lie in [0, m), its columns in q_t.
// The arch supplies quantize_tiles.cuh's Arch (barrier() included).
#pragma once
#include <stdint.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/quantize_tiles.cuh"

// Host and device: the launchers size their grids with it, the CUDA kernel strides over it.
#if defined(__CUDACC__) || defined(__HIP__)
#define FP8GEMM_QHFN __host__ __device__ inline
#else
#define FP8GEMM_QHFN inline
#endif

namespace fp8gemm {

// What the rows are beyond x (QuantizeGroupedTransposedArgs' source fields; fp8gemm/quantize_sources.cuh reads them).
struct RowSource {
  const int64_t* index;
  const float* row_weight;
  const uint8_t* gate_up;
  int64_t source_rows, ld_gate_up_bytes;
};

struct QuantizeGroupedParams {
  QuantizeTransposedParams tiles;  // m rows, m_t = columns (q_t's row length), activations (blocks 0)
  const int32_t* offs;             // [experts] cumulative row ends, as the device finds them
  int64_t experts, blocks;         // q_t's column blocks: columns / 128
  RowSource source;
};

inline QuantizeGroupedParams quantize_grouped_params(const QuantizeGroupedTransposedArgs& a) {
  const QuantizeTransposedParams tiles{reinterpret_cast<const uint8_t*>(a.x), reinterpret_cast<uint8_t*>(a.q),
                                       reinterpret_cast<uint8_t*>(a.q_t), reinterpret_cast<float*>(a.scale),
                                       reinterpret_cast<float*>(a.scale_t), a.m, a.k, a.columns,
                                       a.ldx * (a.in_kind == kInFP32 ? 4 : 2), a.scale_s0, a.scale_s1, a.scale_t_s0,
                                       a.scale_t_s1, a.pow2, 0, a.columns};
  const RowSource source{reinterpret_cast<const int64_t*>(a.index), reinterpret_cast<const float*>(a.row_weight),
                         reinterpret_cast<const uint8_t*>(a.gate_up), a.source_rows,
                         a.ld_gate_up * (a.gate_up_kind == kInFP32 ? 4 : 2)};
  return QuantizeGroupedParams{tiles, reinterpret_cast<const int32_t*>(a.offs), a.experts, a.columns / kQuantBlock,
                               source};
}

// Column-block indices a launch covers: q_t's blocks, then enough for every row to lie past the last end.
FP8GEMM_QHFN int64_t grouped_tile_count(int64_t m, int64_t columns) {
  return columns / kQuantBlock + (m + kQuantBlock - 1) / kQuantBlock;
}

// Shared memory of the search: the clamped ends of one chunk of experts (a prefix maximum), then what it found.
struct ExpertSearch {
  int64_t ends[kQuantThreads];
  int64_t first, end;
};

FP8GEMM_QFN int64_t max64(int64_t a, int64_t b) { return a < b ? b : a; }

// The inclusive prefix maximum of every thread's `value` over the workgroup, left in search.ends (log-step scan).
template <class Arch>
FP8GEMM_QFN void prefix_max(int64_t value, int tid, ExpertSearch& search) {
  search.ends[tid] = value;
  Arch::barrier();
  for (int step = 1; step < kQuantThreads; step <<= 1) {
    const int64_t seen = tid >= step ? max64(value, search.ends[tid - step]) : value;
    Arch::barrier();  // everyone has read the previous step before it is overwritten
    search.ends[tid] = value = seen;
    Arch::barrier();
  }
}

// The expert chunk c0 .. c0 + 255, one expert a thread: its clamped end (the maximum of offs so far, in [0, m]) and
// start (the previous end); the one whose column blocks hold `block` records its rows. Returns the chunk's last end.
// A scan rather than a binary search: the clamped ends are a running maximum of offs, known only once computed.
template <class Arch>
FP8GEMM_QFN int64_t search_chunk(const QuantizeGroupedParams& p, int64_t c0, int64_t block, int64_t before, int tid,
                                 ExpertSearch& search) {
  const int64_t e = c0 + tid, m = p.tiles.m;
  int64_t end = before;  // an expert past the last changes no maximum
  if (e < p.experts) {
    const int64_t raw = p.offs[e];
    end = max64(before, raw < 0 ? 0 : raw < m ? raw : m);
  }
  prefix_max<Arch>(end, tid, search);
  end = search.ends[tid];
  const int64_t start = tid ? search.ends[tid - 1] : before;
  const int64_t base = e + start / kQuantBlock, used = (end - start + kQuantBlock - 1) / kQuantBlock;
  if (e < p.experts && block >= base && block < base + used) {  // column blocks never overlap: one thread at most
    search.first = start + (block - base) * kQuantBlock;
    search.end = end - search.first < kQuantBlock ? end : search.first + kQuantBlock;
  }
  const int64_t last = search.ends[kQuantThreads - 1];
  Arch::barrier();  // everyone has read this chunk's ends before the next one writes them
  return last;
}

// The rows of column-block index `block`: an expert's up to 128 tokens, none (a gap), or past q_t's blocks, rows of
// no expert (q alone).
template <class Arch>
FP8GEMM_QFN TileRows grouped_tile_rows(const QuantizeGroupedParams& p, int64_t block, int tid, ExpertSearch& search) {
  if (tid == 0) search.first = 0, search.end = 0;  // a gap unless an expert claims the block
  int64_t last_end = 0;
  for (int64_t c0 = 0; c0 < p.experts; c0 += kQuantThreads)
    last_end = search_chunk<Arch>(p, c0, block, last_end, tid, search);
  if (block >= p.blocks && tid == 0) {
    const int64_t first = last_end + (block - p.blocks) * kQuantBlock;
    search.first = first;
    search.end = p.tiles.m - first < kQuantBlock ? p.tiles.m : first + kQuantBlock;  // first past m: no rows
  }
  Arch::barrier();
  const TileRows rows{search.first, search.end, block, block < p.blocks};
  Arch::barrier();  // everyone has the rows before a later block's search overwrites them
  return rows;
}

// Column-block indices that hold rows: q_t's blocks, then those of the rows past the last clamped end (the launch
// sizes for all rows, not knowing offs). Every thread calls it; the same on each.
template <class Arch>
FP8GEMM_QFN int64_t grouped_blocks_used(const QuantizeGroupedParams& p, int tid, ExpertSearch& search) {
  int64_t last_end = 0;
  for (int64_t c0 = 0; c0 < p.experts; c0 += kQuantThreads)
    last_end = search_chunk<Arch>(p, c0, -1, last_end, tid, search);  // block -1: no expert claims it
  return p.blocks + (p.tiles.m - last_end + kQuantBlock - 1) / kQuantBlock;
}

// Column-block index `block` of the launch, K block kb.
template <class Arch, int kIn>
FP8GEMM_QFN void quantize_grouped_tile(const QuantizeGroupedParams& p, int64_t block, int64_t kb, int tid,
                                       ExpertSearch& search, TransposeTile& tile) {
  const TileRows rows = grouped_tile_rows<Arch>(p, block, tid, search);
  if (!rows.transpose && rows.end <= rows.first) return;  // uniform: a leftover index past the last row
  quantize_tile_rows<Arch, kIn>(p.tiles, rows, kb, tid, tile);
}

}  // namespace fp8gemm
