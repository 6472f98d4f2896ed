// FP8 (e4m3fnuz) block-scaled GEMM for gfx942 (MI300X) with MFMA 32x32x16 FP8.
//
// out[m, n] = sum_kb a_scale[m, kb] * b_scale[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// One workgroup per BM x 128 tile of out and split of K: tile.hpp's main loop and masked store (shared with the
// grouped kernel, grouped.hip). Split-K writes fp32 partials that reduce_splits sums. The weight-gradient kernel
// (wgrad_kernel: B scales per column, fp32 out added into) is the same tile with per-column promotion, and its
// k-grouped form (kgrouped_wgrad_kernel) runs it per expert over the expert's own K blocks.
//
// Header-light: compiled either by ROCm's hipcc (FP8GEMM_HIP_HEADERS: the HIP runtime headers) or
// by a bare clang++ -nogpuinc (CI, Debian's clang-19), which needs only hip_compat.hpp's declarations.
#include "hip_compat.hpp"
#include "launch.hpp"
#include "fp8gemm/kgrouped_wgrad.hpp"
#include "tile.hpp"

namespace fp8gemm_gfx942 {

template <int WM, int WN, int TM, int TN>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void gemm_kernel(const Params p) {
  using C = Cfg<WM, WN, TM, TN>;
  __shared__ TileLds<C> lds;

  TileArgs t;
  t.a = p.a, t.b = p.b, t.a_scale = p.a_scale, t.lda = p.lda, t.ldb = p.ldb, t.sa_ld = p.sa_ld;
  t.n0 = __builtin_amdgcn_workgroup_id_x() * kBlockN, t.n = p.n;
  t.row0 = __builtin_amdgcn_workgroup_id_y() * C::kBlockM, t.row_end = p.m;
  t.b_scale_row = p.b_scale + int64_t(t.n0 / kBlockN) * p.sb_ld;
  t.kb_begin = __builtin_amdgcn_workgroup_id_z() * p.kb_per_split;
  t.kb_count = (p.k / kBlockK - t.kb_begin) < p.kb_per_split ? p.k / kBlockK - t.kb_begin : p.kb_per_split;

  TileAcc<C> total;
  tile_mainloop<C>(t, lds, total);
  float* partial = p.partial ? p.partial + int64_t(__builtin_amdgcn_workgroup_id_z()) * p.m * p.n : nullptr;
  tile_store<C>(total, t.row0, p.m, t.n0, p.n, [&](int row, int col, float x) {
    if (partial)
      partial[int64_t(row) * p.n + col] = x;
    else
      store_out(p.out, p.ldo, p.out_fp32, row, col, x);
  });
}

// The weight-gradient tile (fp8gemm/training_entries.hpp): B scales per row of b, MN-major (b_scale[kb * sb_ld +
// column], 1 x 128 along K on both operands), each column promoted with its own (tile.hpp kColumns); K blocks
// [kb_begin, kb_begin + kb_count) in one workgroup (no split), fp32 `out` written or with `accumulate` added into, or
// bf16 out written.
template <class C>
__device__ inline void wgrad_tile(const Params& p, int accumulate, int kb_begin, int kb_count, void* out,
                                  TileLds<C, true>& lds) {
  TileArgs t;
  t.a = p.a, t.b = p.b, t.a_scale = p.a_scale, t.lda = p.lda, t.ldb = p.ldb, t.sa_ld = p.sa_ld;
  t.b_scale_row = nullptr, t.b_scale_cols = p.b_scale, t.sb_ld = p.sb_ld;
  t.n0 = __builtin_amdgcn_workgroup_id_x() * kBlockN, t.n = p.n;
  t.row0 = __builtin_amdgcn_workgroup_id_y() * C::kBlockM, t.row_end = p.m;
  t.kb_begin = kb_begin, t.kb_count = kb_count;

  TileAcc<C> total;
  tile_mainloop<C, true>(t, lds, total);
  tile_store<C>(total, t.row0, p.m, t.n0, p.n, [&](int row, int col, float x) {
    if (!accumulate) return store_out(out, p.ldo, p.out_fp32, row, col, x);  // fp32, or bf16 rounded once
    float& o = static_cast<float*>(out)[int64_t(row) * p.ldo + col];
    o += x;
  });
}

// The weight-gradient GEMM: every K block.
template <int WM, int WN, int TM, int TN>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void wgrad_kernel(const Params p, int accumulate) {
  using C = Cfg<WM, WN, TM, TN>;
  __shared__ TileLds<C, true> lds;
  wgrad_tile<C>(p, accumulate, 0, p.k / kBlockK, p.out, lds);
}

// Expert e's K blocks (fp8gemm/kgrouped_wgrad.hpp). Its start is the clamped largest of offs[0 .. e): each work-item
// takes every kThreads-th expert before e, then a tree in LDS; its end is offs[e] clamped to [start, bound]. Every
// work-item calls it: it holds block_sync()s.
__device__ inline fp8gemm::ExpertKBlocks expert_blocks(const KGroupedParams& g, int e, int k, int* largest) {
  const int tid = thread_id();
  int seen = 0;  // below every clamped end: expert 0 starts at 0
  for (int j = tid; j < e; j += kThreads) {
    const int end = g.offs[j];
    seen = end > seen ? end : seen;
  }
  largest[tid] = seen;
  block_sync();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half && largest[tid + half] > largest[tid]) largest[tid] = largest[tid + half];
    block_sync();
  }
  const int bound = fp8gemm::kgrouped_token_bound(k, g.experts);
  const int start = fp8gemm::clamp_expert_end(largest[0], 0, bound);
  return fp8gemm::expert_k_blocks(e, start, fp8gemm::clamp_expert_end(g.offs[e], start, bound));
}

// The k-grouped weight-gradient GEMM: workgroup z is expert e, its tile of out[e] (out + e * out_es elements) over e's
// own K blocks; an expert without tokens writes zeros, or with `accumulate` leaves out[e] untouched.
template <int WM, int WN, int TM, int TN>
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void kgrouped_wgrad_kernel(
    const Params p, int accumulate, const KGroupedParams g) {
  using C = Cfg<WM, WN, TM, TN>;
  __shared__ TileLds<C, true> lds;
  __shared__ int largest[kThreads];
  const int e = __builtin_amdgcn_workgroup_id_z();
  const fp8gemm::ExpertKBlocks kb = expert_blocks(g, e, p.k, largest);
  if (accumulate && kb.end == kb.begin) return;  // the same for the whole workgroup, after its last barrier
  void* out = static_cast<uint8_t*>(p.out) + int64_t(e) * g.out_es * (p.out_fp32 ? 4 : 2);
  wgrad_tile<C>(p, accumulate, kb.begin, kb.end - kb.begin, out, lds);
}

// Split-K epilogue: out = sum of the fp32 partials over the splits.
__global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void reduce_splits(const Params p, int splits) {
  const int64_t count = int64_t(p.m) * p.n;
  const int64_t stride = int64_t(__builtin_amdgcn_grid_size_x());
  for (int64_t idx = int64_t(__builtin_amdgcn_workgroup_id_x()) * kThreads + thread_id(); idx < count; idx += stride) {
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += p.partial[int64_t(z) * count + idx];
    const int64_t row = idx / p.n, col = idx % p.n;
    store_out(p.out, p.ldo, p.out_fp32, row, col, s);
  }
}

template <int WM, int WN, int TM, int TN>
int enqueue_tiles(const Params& p, const Geometry& g, void* stream) {
  void* args[] = {const_cast<Params*>(&p)};
  return hipLaunchKernel(reinterpret_cast<const void*>(&gemm_kernel<WM, WN, TM, TN>), dim3(g.grid_x, g.grid_y, g.grid_z),
                         dim3(kThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_gemm(const Params& p, const Geometry& g, void* stream) {
  // tile.hpp's Cfg128 (2 x 2 wavefronts of 2 x 2 MFMA tiles) and Cfg32 (1 x 4 wavefronts of 1 x 1).
  return g.config == TileConfig::M128 ? enqueue_tiles<2, 2, 2, 2>(p, g, stream) : enqueue_tiles<1, 4, 1, 1>(p, g, stream);
}

int enqueue_wgrad(const Params& p, const Geometry& g, int accumulate, void* stream) {
  void* args[] = {const_cast<Params*>(&p), &accumulate};
  const void* kernel = g.config == TileConfig::M128 ? reinterpret_cast<const void*>(&wgrad_kernel<2, 2, 2, 2>)
                                                    : reinterpret_cast<const void*>(&wgrad_kernel<1, 4, 1, 1>);
  return hipLaunchKernel(kernel, dim3(g.grid_x, g.grid_y, 1), dim3(kThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_kgrouped_wgrad(const Params& p, const KGroupedParams& kg, const Geometry& g, int accumulate, void* stream) {
  void* args[] = {const_cast<Params*>(&p), &accumulate, const_cast<KGroupedParams*>(&kg)};
  const void* kernel = g.config == TileConfig::M128 ? reinterpret_cast<const void*>(&kgrouped_wgrad_kernel<2, 2, 2, 2>)
                                                    : reinterpret_cast<const void*>(&kgrouped_wgrad_kernel<1, 4, 1, 1>);
  return hipLaunchKernel(kernel, dim3(g.grid_x, g.grid_y, kg.experts), dim3(kThreads), args, 0,
                         static_cast<hipStream_t>(stream));
}

int enqueue_reduce(const Params& p, int splits, int blocks, void* stream) {
  void* args[] = {const_cast<Params*>(&p), &splits};
  return hipLaunchKernel(reinterpret_cast<const void*>(&reduce_splits), dim3(blocks), dim3(kThreads), args, 0,
                         static_cast<hipStream_t>(stream));
}

}  // namespace fp8gemm_gfx942
