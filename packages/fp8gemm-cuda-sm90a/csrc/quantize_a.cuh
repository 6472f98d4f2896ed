// The quantizer warps of a kQuantA kernel (producer warps 1-3): per stage, A's bf16/fp16 rows, loaded by TMA as
// unswizzled 256-byte rows, become FP8 codes in the 128-byte-swizzled layout the wgmma reads, and their scales,
// bit-identical to the activation quantizer (fp8gemm/quantize_rows.cuh, the same per-lane code). In place: FP8
// row r takes bytes [128 r, 128 r + 128), inside 16-bit row r / 2, which an earlier pass already read.
#pragma once

#include "fp8gemm/cuda/e4m3.cuh"
#include "ptx.cuh"
#include "scheduler.cuh"

namespace fp8gemm_sm90a {

constexpr int kQuantBar = 14;  // named barrier of the quantizer warps (see kEpiFullBar for the others)

// One pass: rows [r0, r0 + 6) of the stage, 16 lanes per row, 8 values per lane.
template <class C, int kIn>
__device__ __forceinline__ void quantize_pass(uint8_t* stage, float* scales, int r0, int rows, int group, int lane16,
                                              bool pow2) {
  using fp8gemm::cuda::E4m3Arch;
  const int r = r0 + group;
  const bool mine = r < rows;  // whole 16-lane groups (group_max shuffles within one)
  float v[8];
  float scale = 0.0f;
  if (mine) {
    E4m3Arch::widen8<kIn>(*reinterpret_cast<const uint4*>(stage + r * 2 * kBlockK + lane16 * 16), v);
    scale = fp8gemm::scale_lane_values<E4m3Arch>(v, pow2);
  }
  named_bar_sync<kQuantBar, C::kQuantThreads>();  // every read of this pass before a write lands in a read row
  if (mine) {
    // SW128: 16-byte chunk c of row r sits at chunk c ^ (r % 8); a lane's 8 codes are half a chunk.
    const int chunk = (lane16 >> 1) ^ (r & 7);
    *reinterpret_cast<uint2*>(stage + r * kBlockK + chunk * 16 + (lane16 & 1) * 8) = E4m3Arch::narrow8(v);
    if (lane16 == 0) scales[r] = scale;
  }
}

template <class C>
__device__ __forceinline__ void quantize_tiles(const SharedStorage<C>& smem, const Params& p, TileWalk walk, int kb_total) {
  constexpr int kRowsPerPass = C::kQuantThreads / 16;
  const int q = threadIdx.x % 128 - 32;  // producer warps 1-3
  const int group = q / 16, lane16 = q % 16;
  const bool pow2 = p.a_pow2 != 0;
  Ring<C::kStages> ring;
  for (int t = walk.first; t < walk.count; t += walk.stride) {
    const Tile tile = tile_at<1, false, C::kBlockM>(p, t, 0);
    const KRange k = k_range(p, tile, kb_total);
    const int rows = min(C::kBlockM, p.m - tile.row0);  // rows past M reach only accumulator rows never stored
    for (int kb = k.begin; kb < k.end; ++kb, ring.advance()) {
      const int s = ring.stage;
      mbar_wait(&smem.loaded[s], ring.phase);
      uint8_t* stage = smem.tiles_a + s * C::kAStageBytes;
      float* scales = smem.scales + s * C::kBlockM;
      for (int r0 = 0; r0 < rows; r0 += kRowsPerPass) {
        if (p.a_fp16) quantize_pass<C, fp8gemm::kInFP16>(stage, scales, r0, rows, group, lane16, pow2);
        else quantize_pass<C, fp8gemm::kInBF16>(stage, scales, r0, rows, group, lane16, pow2);
      }
      fence_async_shared();  // these generic writes, before the consumers' wgmma (async proxy) reads them
      mbar_arrive(&smem.full[s]);
    }
  }
}

}  // namespace fp8gemm_sm90a
