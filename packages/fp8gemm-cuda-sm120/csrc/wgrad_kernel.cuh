// The weight-gradient GEMM (fp8gemm/backend.hpp WgradArgs, "1D1D": 1 x 128 scales along K on both operands):
//
// out[m, n] (+)= sum_kb a_scale[m, kb] * b_scale[n, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// The dense kernel's tile (gemm_kernel.cuh tile_mainloop, tile_store) with kColumnScales: each pipeline stage also
// holds the B scales of the tile's 128 columns for its K block (MN-major, as A's), and each thread promotes its
// accumulator columns with their own. Never split along K (an accumulated out would need the splits' partials reduced into it).
// The epilogue writes fp32 (added into out with accumulate) or bf16 (the fp32 sum rounded once).
//
// The k-grouped form (KGroupedWgradArgs, kGrouped) runs the same tile per expert, grid z: expert e's K blocks of the
// per-expert 128-aligned layout (fp8gemm/kgrouped_wgrad.hpp) into out[e]; an expert without tokens writes zeros, or
// with accumulate leaves out[e] untouched. The layout's gap columns hold zero codes, so whole K blocks are read.
#pragma once

#include <cstdint>

#include "fp8gemm/kgrouped_wgrad.hpp"
#include "gemm_kernel.cuh"

namespace fp8gemm_sm120 {

// What both forms read besides the operands (Params: b_scale per column, MN-major; kb_per_split unused).
struct WgradParams {
  Params g;
  const int32_t* offs;  // k-grouped: [experts] cumulative token ends, clamped on the device
  int experts;
  int accumulate;
  int64_t out_es;  // k-grouped: elements from out[e] to out[e + 1]
};

// Expert e's K blocks. Its start is the clamped largest of offs[0 .. e): each thread takes every kThreads-th end
// before e, then a warp and a block maximum through `scratch` (kThreads / 32 ints of shared memory). Every thread
// calls it: it holds __syncthreads, the last so that the pipeline may overwrite the scratch.
template <int kThreads>
__device__ __forceinline__ fp8gemm::ExpertKBlocks expert_blocks(const WgradParams& w, int e, int k, int* scratch) {
  int seen = 0;  // below every clamped end: expert 0 starts at 0
  for (int j = threadIdx.x; j < e; j += kThreads) seen = max(seen, __ldg(w.offs + j));
  seen = __reduce_max_sync(0xffffffffu, seen);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = seen;
  __syncthreads();
  int largest = 0;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) largest = max(largest, scratch[i]);
  __syncthreads();
  const int bound = fp8gemm::kgrouped_token_bound(k, w.experts);
  const int start = fp8gemm::clamp_expert_end(largest, 0, bound);
  return fp8gemm::expert_k_blocks(e, start, fp8gemm::clamp_expert_end(__ldg(w.offs + e), start, bound));
}

// Two adjacent columns (row, col) of fp32 out added into, or written as store_pair does. `paired`: out[e] and its
// rows start at a multiple of two elements, so a pair moves as one float2 / bf16x2.
__device__ __forceinline__ void wgrad_store(void* out, int64_t ldo, bool fp32, bool accumulate, bool paired, int row,
                                            int col, float x, float y) {
  if (accumulate) {  // fp32 only (the host refuses bf16 with accumulate)
    float* dst = static_cast<float*>(out) + row * ldo + col;
    if (paired) {
      float2 o = *reinterpret_cast<float2*>(dst);
      o.x += x, o.y += y;
      *reinterpret_cast<float2*>(dst) = o;
    } else {
      dst[0] += x, dst[1] += y;
    }
  } else if (paired) {
    store_pair(out, ldo, fp32, row, col, x, y);
  } else if (fp32) {
    float* dst = static_cast<float*>(out) + row * ldo + col;
    dst[0] = x, dst[1] = y;
  } else {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(out) + row * ldo + col;
    dst[0] = __float2bfloat16_rn(x), dst[1] = __float2bfloat16_rn(y);
  }
}

template <int WARPS_M, int STAGES, bool kGrouped>
__global__ void __launch_bounds__(Traits<WARPS_M, STAGES, true>::kThreads, 1) wgrad_kernel(const WgradParams w) {
  using T = Traits<WARPS_M, STAGES, true>;
  extern __shared__ __align__(128) uint8_t smem[];
  const Params& p = w.g;
  const int n0 = blockIdx.x * kBlockN, m0 = blockIdx.y * T::kBlockM;
  int kb_begin = 0, kb_end = p.k / kBlockK;
  void* out = p.out;
  if constexpr (kGrouped) {
    const fp8gemm::ExpertKBlocks kb = expert_blocks<T::kThreads>(w, blockIdx.z, p.k, reinterpret_cast<int*>(smem));
    if (w.accumulate && kb.end == kb.begin) return;  // the same for the whole block, after its last barrier
    kb_begin = kb.begin, kb_end = kb.end;
    out = static_cast<uint8_t*>(p.out) + int64_t(blockIdx.z) * w.out_es * (p.out_fp32 ? 4 : 2);
  }
  TileAcc<WARPS_M, STAGES> total;
  tile_mainloop<WARPS_M, STAGES, true, true>(p, nullptr, smem, m0, n0, kb_begin, kb_end - kb_begin, total);
  const int elem = p.out_fp32 ? 4 : 2;
  const bool paired = ((reinterpret_cast<uintptr_t>(out) | uintptr_t(p.ldo * elem)) % (2 * elem)) == 0;
  const bool accumulate = w.accumulate != 0;
  tile_store<WARPS_M, STAGES>(total, m0, p.m, n0, p.n, [&](int row, int col, float x, float y) {
    wgrad_store(out, p.ldo, p.out_fp32, accumulate, paired, row, col, x, y);
  });
}

}  // namespace fp8gemm_sm120
