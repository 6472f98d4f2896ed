// The epilogue: a consumer warpgroup's running totals to the output. bf16 tiles leave through shared
// memory (stmatrix) and TMA stores, issued by one thread of the warpgroup or, for 256-row tiles, by the
// store warp (producer.cuh); the two-warpgroup weight-gradient tiles' fp32 out through shared memory and TMA stores
// or reduce-adds; other fp32 output, split-K partials and 16-wide tiles are stored directly.
// Accumulator layout: register 4g + j holds column 8g + 2 (lane % 4) + (j & 1), row (lane / 4) + 8 (j / 2).
#pragma once

#include "ptx.cuh"
#include "scheduler.cuh"

namespace fp8gemm_sm90a {

// One consumer warpgroup's bf16 tile from its epilogue buffer to global memory (one thread).
template <typename C, int kBlockN, int kSub>
__device__ __forceinline__ void store_warpgroup_tile(const CUtensorMap* map_out, const uint8_t* buf, const Params& p,
                                                     int row0, int n_first, int warpgroup, int a_group = 0) {
  if constexpr (C::kType == GemmType::kGrouped || C::kKGrouped) {  // 3-D map: the box never reaches the next group
    static_assert(C::kWideStore, "grouped kernels: 64-column store boxes");
    const int row = row0 + warpgroup * kSub * 64;
    if (C::kKGrouped && row >= p.m) return;  // a warpgroup of a tile taller than M with no row inside it
#pragma unroll
    for (int c = 0; c < kBlockN / 64; ++c)
      if (n_first + 64 * c < p.n) tma_store_3d(map_out, buf + c * (kSub * 64 * 128), n_first + 64 * c, row, a_group);
  } else if constexpr (C::kWideStore) {
    const int row = row0 + warpgroup * kSub * 64;
    if (row < p.m) {
#pragma unroll
      for (int c = 0; c < kBlockN / 64; ++c)
        if (n_first + 64 * c < p.n) tma_store_2d(map_out, buf + c * (kSub * 64 * 128), n_first + 64 * c, row);
    }
  } else {
#pragma unroll
    for (int slice = 0; slice < kSub; ++slice) {
      const int row = row0 + (warpgroup * kSub + slice) * 64;
      if (row < p.m) {
#pragma unroll
        for (int c = 0; c < kBlockN / 32; ++c)
          if (n_first + 32 * c < p.n)
            tma_store_2d(map_out, buf + slice * 64 * kBlockN * 2 + c * 64 * 64, n_first + 32 * c, row);
      }
    }
  }
  tma_store_commit();
}

// Grouped kernels: whether warpgroup wg's store box (64 kSub rows from first_row) lies inside the tile's rows of its
// group; one that does not would write the neighbour group's rows, so only those rows are copied out instead.
template <class C>
__device__ __forceinline__ bool box_in_group(const Tile& tile, int first_row) {
  return first_row >= tile.lo && first_row + C::kSub * 64 <= tile.hi;
}

// Grouped kernels: the rows [tile.lo, tile.hi) of a warpgroup's staged bf16 tile (64-column boxes of 64 kSub
// rows, 16-byte chunk c of row r at chunk c ^ (r % 8): epilogue_tma's layout), 16 bytes per thread and step.
template <class C, int kThreads>
__device__ __forceinline__ void copy_rows_out(const uint8_t* buf, const Params& p, const Tile& tile, int first_row,
                                              int n_first, int thread) {
  constexpr int kRows = 64 * C::kSub, kChunks = C::kBlockN / 8;
  const int lo = max(tile.lo - first_row, 0), hi = min(tile.hi - first_row, kRows);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tile.a_group * p.out_gs;
  for (int i = thread; i < (hi - lo) * kChunks; i += kThreads) {
    const int r = lo + i / kChunks, c = i % kChunks, col = n_first + 8 * c;
    if (col >= p.n) continue;  // N % 16 == 0: a chunk is wholly inside N or outside
    const uint4 v = *reinterpret_cast<const uint4*>(buf + (c / 8) * (kRows * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4));
    *reinterpret_cast<uint4*>(out + int64_t(first_row + r) * p.ldo + col) = v;
  }
}

// bf16 through shared memory: stage the warpgroup's 64 kSub x BLOCK_N rows as TMA boxes, then one thread
// (of the warpgroup, or the store warp) hands them to the TMA engine (rows past M, columns past N are
// clipped by the tensor map) and the warpgroup moves on to its next tile while the copies drain.
template <class C>
__device__ __forceinline__ void epilogue_tma(const CUtensorMap* map_out, uint8_t* epilogue, const Params& p,
                                             const Tile& tile, int warpgroup, int row_wg, int warp, int lane,
                                             const float (&total)[C::kSub][C::kAcc]) {
  constexpr int kSub = C::kSub, kBlockN = C::kBlockN;
  const int n_first = tile.n_block * kBlockN;
  uint8_t* buf = epilogue + row_wg * kSub * 64 * kBlockN * 2;
  const bool issuer = threadIdx.x % 128 == 0;
  if constexpr (C::kStoreWarp) {  // the store warp read the buffer out
    named_bar_sync<160>(kEpiFreeBar + warpgroup);
  } else {
    if (issuer) tma_store_wait_read();  // buffer free again
    named_bar_sync<128>(1 + warpgroup);
  }
  // stmatrix x4 writes four 8 x 8 bf16 matrices whose fragments are the accumulator layout:
  // (group g, rows 0-7), (g, rows 8-15), (g + 1, rows 0-7), (g + 1, rows 8-15); lane l
  // gives the address of row l % 8 of matrix l / 8.
  const int q = lane / 8, r = warp * 16 + (q % 2) * 8 + lane % 8;
  const uint32_t buf_addr = smem_u32(buf);
  // This lane's 16-byte chunk of 8-column group `group` in slice `slice`; conflict-free.
  auto chunk_addr = [&](int slice, int group) -> uint32_t {
    if constexpr (C::kWideStore)  // boxes of all 64 kSub rows x 64 columns, 128-byte rows: chunk ^ row % 8
      return buf_addr + (group / 8) * (kSub * 64 * 128) + (slice * 64 + r) * 128 + (((group % 8) ^ (r % 8)) << 4);
    else  // per slice, 64 x 32 boxes of 64-byte rows: chunk ^ (row / 2) % 4
      return buf_addr + slice * 64 * kBlockN * 2 + (group / 4) * 64 * 64 + r * 64 + (((group % 4) ^ ((r >> 1) & 3)) << 4);
  };
#pragma unroll
  for (int slice = 0; slice < kSub; ++slice) {
    const float* v = total[slice];
#pragma unroll
    for (int g = 0; g < C::kGroups; g += 2)
      stmatrix_x4(chunk_addr(slice, g + q / 2), pack_bf16(v[4 * g], v[4 * g + 1]), pack_bf16(v[4 * g + 2], v[4 * g + 3]),
                  pack_bf16(v[4 * g + 4], v[4 * g + 5]), pack_bf16(v[4 * g + 6], v[4 * g + 7]));
  }
  fence_async_shared();  // visible to the TMA engine
  if constexpr (C::kStoreWarp) {  // hand the buffer to the store warp; no wait here
    if constexpr (C::kType == GemmType::kGrouped) {  // a box crossing the group's end: copied here, then handed back
      const int first = tile.row0 + warpgroup * kSub * 64;
      if (!box_in_group<C>(tile, first)) {
        named_bar_sync<128>(1 + warpgroup);
        copy_rows_out<C, 128>(buf, p, tile, first, n_first, threadIdx.x % 128);
      }
    }
    named_bar_arrive<160>(kEpiFullBar + warpgroup);
    return;
  }
  named_bar_sync<128>(1 + warpgroup);
  if constexpr (C::kType == GemmType::kGrouped) {
    const int first = tile.row0 + warpgroup * kSub * 64;
    if (!box_in_group<C>(tile, first)) {
      copy_rows_out<C, 128>(buf, p, tile, first, n_first, threadIdx.x % 128);
      return;
    }
  }
  // k-grouped: expert `split`'s out, clipped at its M rows (the last M block's rows of the block before, recomputed,
  // are written again with the same bits: bf16 out is never accumulated)
  const int group = C::kKGrouped ? tile.split : tile.a_group;
  if (issuer) store_warpgroup_tile<C, kBlockN, kSub>(map_out, buf, p, tile.row0, n_first, warpgroup, group);
}

// Weight-gradient fp32 out through shared memory: each warpgroup stages its 64 rows in boxes of 64 rows x 32 columns
// (128-byte rows, 128-byte swizzle: a row pair's 32 bytes per group, two wavefronts a warp), as many as its share of the
// epilogue buffer holds, and one thread stores them, or adds them into out at the memory with p.accumulate (TMA's
// reduce-add; the caller keeps a last M block that starts early, whose rows of the block before must not be added
// twice, on the direct stores). Rows past M and columns past N are clipped by the tensor map.
template <class C>
__device__ __forceinline__ void epilogue_f32_tma(const CUtensorMap* map_out, uint8_t* epilogue, const Params& p,
                                                 const Tile& tile, const float (&total)[C::kSub][C::kAcc]) {
  constexpr int kBoxes = C::kBlockN / 32, kBoxBytes = 64 * 32 * 4;
  constexpr int kPerRound = 64 * C::kBlockN * 2 / kBoxBytes;  // the warpgroup's share of the (bf16-sized) buffer
  static_assert(C::kSub == 1 && kPerRound >= 1, "one 64-row slice per warpgroup");
  // Formed here, not hoisted before the main loop and held across it.
  const int thread = fresh_thread_index(), warpgroup = thread / 128, lane = thread % 32;
  const uint8_t* const base = epilogue + warpgroup * 64 * C::kBlockN * 2;
  const uint32_t buf = smem_u32(base);
  const bool issuer = thread % 128 == 0;
  const int r = (thread / 32) % 4 * 16 + lane / 4, c = lane % 4;  // rows r, r + 8 of the slice; columns 8g + 2c, + 1
  const int row = tile.row0 + warpgroup * 64, n_first = tile.n_block * C::kBlockN;
#pragma unroll
  for (int b0 = 0; b0 < kBoxes; b0 += kPerRound) {
    if (issuer) tma_store_wait_read();  // the buffer's previous boxes read out
    named_bar_sync<128>(1 + warpgroup);
#pragma unroll
    for (int b = b0; b < b0 + kPerRound && b < kBoxes; ++b) {
#pragma unroll
      for (int gi = 0; gi < 4; ++gi) {
        const int g = 4 * b + gi;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // 16-byte chunk 2 gi + c / 2 of row r + 8 half, swizzled by the row's index mod 8 (r % 8 = lane / 4)
          const uint32_t at = buf + (b - b0) * kBoxBytes + (r + 8 * half) * 128 + (((2 * gi + c / 2) ^ (lane / 4)) << 4) +
                              (c % 2) * 8;
          sts_f32(at, total[0][4 * g + 2 * half]);
          sts_f32(at + 4, total[0][4 * g + 2 * half + 1]);
        }
      }
    }
    fence_async_shared();  // visible to the TMA engine
    named_bar_sync<128>(1 + warpgroup);
    if (issuer && row < p.m) {
#pragma unroll
      for (int b = b0; b < b0 + kPerRound && b < kBoxes; ++b) {
        const int col = n_first + 32 * b;
        if (col >= p.n) continue;
        const uint8_t* src = base + (b - b0) * kBoxBytes;
        if constexpr (C::kKGrouped) {  // expert `split`'s out: a 3-D map over [experts, m, n]
          if (p.accumulate) tma_reduce_add_3d(map_out, src, col, row, tile.split);
          else tma_store_3d(map_out, src, col, row, tile.split);
        } else {
          if (p.accumulate) tma_reduce_add_2d(map_out, src, col, row);
          else tma_store_2d(map_out, src, col, row);
        }
      }
      tma_store_commit();
    }
  }
}

// fp32 output, split-K partials, narrow bf16 tiles, the 192-row weight-gradient tile (fp32, added into out with
// p.accumulate, or bf16) and out no TMA map addresses: direct stores. N % 16 == 0, so an 8-column group is wholly
// inside N or wholly outside.
template <class C, bool kAccumulate = false>  // kAccumulate: weight-gradient fp32 out += the product (p.accumulate)
__device__ __forceinline__ void epilogue_direct(const Params& p, const Tile& tile, int row_in_tile, int lane,
                                                const float (&total)[C::kSub][C::kAcc]) {
  const int n0 = tile.n_block * C::kBlockN + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 2 * C::kSub; ++i) {  // row (lane / 4) + 8 half of slice i / 2: one row pointer each
    const int slice = i / 2, half = i % 2;
    const int row = tile.row0 + row_in_tile + 64 * slice + 8 * half;
    float* row_f32;  // fp32 out or partials
    __nv_bfloat16* row_bf16;
    if constexpr (C::kType == GemmType::kGrouped) {  // only the tile's rows of its group; no split-K
      if (row < tile.lo || row >= tile.hi) continue;
      const int64_t at = tile.a_group * p.out_gs + row * p.ldo;
      row_f32 = static_cast<float*>(p.out) + at, row_bf16 = static_cast<__nv_bfloat16*>(p.out) + at;
    } else if constexpr (C::kWgrad) {
      // Only the rows of this tile's own M block: the last block starts early (scheduler.cuh tile_at), and its rows of
      // the block before, recomputed, must not be added into out twice.
      if (row >= p.m || row < tile.m_block * C::kBlockM) continue;
      const int64_t at = (C::kKGrouped ? tile.split * p.out_gs : 0) + row * p.ldo;  // k-grouped: expert split's out
      row_f32 = static_cast<float*>(p.out) + at, row_bf16 = static_cast<__nv_bfloat16*>(p.out) + at;
    } else {
      if (row >= p.m) continue;
      row_f32 = p.partial ? p.partial + (int64_t(tile.split) * p.m + row) * p.n : static_cast<float*>(p.out) + row * p.ldo;
      row_bf16 = static_cast<__nv_bfloat16*>(p.out) + row * p.ldo;
    }
    const bool f32 = p.partial || p.out_fp32;
#pragma unroll
    for (int g = 0; g < C::kGroups; ++g) {
      const int col = n0 + 8 * g;
      if (col >= p.n) continue;
      const float x = total[slice][4 * g + 2 * half], y = total[slice][4 * g + 2 * half + 1];
      // Two 4-byte stores, not one float2: an 8-byte store wants x in an even register, which made
      // ptxas give every running total the register parity of its wgmma accumulator, so each
      // promotion FFMA read two operands from one register bank.
      if constexpr (C::kWgrad) {
        if (!p.out_fp32) {  // bf16 (never with accumulate): the fp32 product rounded once
          *reinterpret_cast<__nv_bfloat162*>(row_bf16 + col) = __floats2bfloat162_rn(x, y);
          continue;
        }
        if constexpr (kAccumulate) {  // out += the product at the memory, fire and forget: no load of out waits here
          red_add_f32(row_f32 + col, x), red_add_f32(row_f32 + col + 1, y);
        } else {
          row_f32[col] = x, row_f32[col + 1] = y;
        }
        continue;
      }
      if (f32) row_f32[col] = x, row_f32[col + 1] = y;
      else *reinterpret_cast<__nv_bfloat162*>(row_bf16 + col) = __floats2bfloat162_rn(x, y);
    }
  }
}

}  // namespace fp8gemm_sm90a
