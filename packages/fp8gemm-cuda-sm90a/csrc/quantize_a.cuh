// The quantizer warps of a kQuantA kernel (producer warps 1-3): A's bf16/fp16 rows, loaded by TMA into a stage as
// unswizzled 256-byte rows, become FP8 codes in the 128-byte-swizzled layout the wgmma reads, and their scales,
// bit-identical to the activation quantizer (the same per-lane code, fp8gemm/quantize_rows.cuh). In place: FP8
// row r takes bytes [128 r, 128 r + 128), inside 16-bit row r / 2, which the same lanes read before.
// Each 16-lane group owns every sixth stage, so six stages are in conversion at once: one stage's chain of
// load, shuffles, divisions and stores is long, and decode stages have a row or two.
#pragma once

#include "fp8gemm/cuda/e4m3.cuh"
#include "ptx.cuh"
#include "scheduler.cuh"

namespace fp8gemm_sm90a {

constexpr int kQuantGroups = 6;  // 16-lane groups in producer warps 1-3

// Rows [r0, r0 + 2) of a stage, 16 lanes per row, 8 values per lane; `mask`: this group's lanes.
template <class C, int kIn>
__device__ __forceinline__ void quantize_row_pair(uint8_t* stage, float* scales, int r0, int rows, int lane16,
                                                  unsigned mask, bool pow2) {
  using fp8gemm::cuda::E4m3Arch;
  float v[2][8], scale[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (r0 + i < rows) {  // uniform over the group (group_max shuffles within it)
      E4m3Arch::widen8<kIn>(*reinterpret_cast<const uint4*>(stage + (r0 + i) * 2 * kBlockK + lane16 * 16), v[i]);
      scale[i] = fp8gemm::scale_lane_values<E4m3Arch>(v[i], pow2);
    }
  }
  __syncwarp(mask);  // the group's reads of these rows before its writes land in them
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + i;
    if (r < rows) {
      // SW128: 16-byte chunk c of row r sits at chunk c ^ (r % 8); a lane's 8 codes are half a chunk.
      const int chunk = (lane16 >> 1) ^ (r & 7);
      *reinterpret_cast<uint2*>(stage + r * kBlockK + chunk * 16 + (lane16 & 1) * 8) = E4m3Arch::narrow8(v[i]);
      if (lane16 == 0) scales[r] = scale[i];
    }
  }
  __syncwarp(mask);
}

template <class C, int kIn>
__device__ __forceinline__ void quantize_stage(const SharedStorage<C>& smem, int s, uint32_t phase, int rows, int lane16,
                                               unsigned mask, bool pow2) {
  mbar_wait(&smem.loaded[s], phase);
  uint8_t* stage = smem.tiles_a + s * C::kAStageBytes;
  float* scales = smem.scales + s * C::kBlockM;
  for (int r0 = 0; r0 < rows; r0 += 2) quantize_row_pair<C, kIn>(stage, scales, r0, rows, lane16, mask, pow2);
  fence_async_shared();  // these generic writes, before the consumers' wgmma (async proxy) reads them
  mbar_arrive(&smem.full[s]);
}

template <class C>
__device__ __forceinline__ void quantize_tiles(const SharedStorage<C>& smem, const Params& p, TileWalk walk, int kb_total) {
  const int q = threadIdx.x % 128 - 32;  // producer warps 1-3
  const int group = q / 16, lane16 = q % 16;
  const unsigned mask = 0xffffu << (threadIdx.x & 16);
  const bool pow2 = p.a_pow2 != 0;
  Ring<C::kStages> ring;
  int owner = 0;  // the group that converts the stage at `ring`
  for (int t = walk.first; t < walk.count; t += walk.stride) {
    const Tile tile = tile_at<1, false, C::kBlockM>(p, t, 0);
    const KRange k = k_range(p, tile, kb_total);
    const int rows = min(C::kBlockM, p.m - tile.row0);  // rows past M reach only accumulator rows never stored
    for (int kb = k.begin; kb < k.end; ++kb, ring.advance(), owner = owner + 1 == kQuantGroups ? 0 : owner + 1) {
      if (owner != group) continue;
      if (p.a_fp16) quantize_stage<C, fp8gemm::kInFP16>(smem, ring.stage, ring.phase, rows, lane16, mask, pow2);
      else quantize_stage<C, fp8gemm::kInBF16>(smem, ring.stage, ring.phase, rows, lane16, mask, pow2);
    }
  }
}

}  // namespace fp8gemm_sm90a
