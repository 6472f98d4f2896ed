// The k-grouped weight-gradient GEMM's expert ranges (fp8gemm/backend.hpp KGroupedWgradArgs), the rule every arch's
// kgrouped_wgrad_launch reads offs by, as fp8gemm.training.grouped_quantize.expert_columns and block_experts do: each
// token end clamped to [previous end, the layout's token bound], expert e's tokens [start, end) in the whole 128-column
// K blocks from block e + start / 128. Plain C++ without the standard library (gfx942 compiles it with a bare clang in
// HIP mode). sm90a's scheduler.cuh (load_expert_ends, expert_k_range) computes the same inline, in warp shuffles.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIP__)
#define FP8GEMM_KGROUPED_HDFN __host__ __device__ inline  // for kernels and host code alike
#else
#define FP8GEMM_KGROUPED_HDFN inline
#endif

namespace fp8gemm {

constexpr int kKGroupedBlock = 128;  // tokens per K block (one scale along K)

// The most tokens a layout of k columns holds for `experts` experts: the largest M with k = 128 (E + M / 128 + 1).
FP8GEMM_KGROUPED_HDFN int kgrouped_token_bound(int k, int experts) { return k - kKGroupedBlock * experts - 1; }

// One token end as the device reads it: `raw` (offs[e], or the largest of several) clamped to [previous_end, bound];
// previous_end is 0 for expert 0. Clamping is monotone, so the largest of several clamped ends is the clamped largest.
FP8GEMM_KGROUPED_HDFN int clamp_expert_end(int raw, int previous_end, int bound) {
  const int above = raw < previous_end ? previous_end : raw;  // the larger, then the smaller: max then min
  return above < bound ? above : bound;
}

// The K blocks [begin, end) of expert e with tokens [start, end_token): ceil((end_token - start) / 128) blocks from
// e + start / 128, none for an expert without tokens.
struct ExpertKBlocks {
  int begin, end;
};
FP8GEMM_KGROUPED_HDFN ExpertKBlocks expert_k_blocks(int e, int start, int end_token) {
  const int begin = e + start / kKGroupedBlock;
  return {begin, begin + (end_token - start + kKGroupedBlock - 1) / kKGroupedBlock};
}

}  // namespace fp8gemm
