// Activation quantization for gfx942, with and without a transpose: the core's portable kernels
// (fp8gemm/quantize_rows.cuh, fp8gemm/quantize_tiles.cuh, fp8gemm/quantize_sources.cuh) with e4m3fnuz codes (bias 8,
// max 240), a 16-lane max through ds_bpermute, 256 work-items per workgroup.
#include "hip_compat.hpp"
#include "e4m3fnuz_arch.hpp"
#include "fp8gemm/quantize_rows.cuh"
#include "fp8gemm/quantize_grouped_tiles.cuh"
#include "fp8gemm/quantize_sources.cuh"
#include "fp8gemm/quantize_tiles.cuh"
#include "launch.hpp"

namespace fp8gemm_gfx942 {
namespace {

// workgroup x: kQuantRows rows; workgroup y: the K block.
template <int kIn>
__global__ __attribute__((amdgpu_flat_work_group_size(fp8gemm::kQuantThreads, fp8gemm::kQuantThreads))) void quantize_kernel(fp8gemm::QuantizeParams p) {
  const int64_t row = int64_t(__builtin_amdgcn_workgroup_id_x()) * fp8gemm::kQuantRows +
                      __builtin_amdgcn_workitem_id_x() / fp8gemm::kQuantLanes;
  if (row >= p.m) return;  // whole 16-lane groups leave together
  fp8gemm::quantize_group<E4m3fnuzArch, kIn>(p, row, __builtin_amdgcn_workgroup_id_y(),
                                              __builtin_amdgcn_workitem_id_x() % fp8gemm::kQuantLanes);
}

// workgroup x: the 128-row block; workgroup y: the K block. One 128 x 128 tile, read once, written as q and q_t. A
// 16-lane group (one row of the tile) stays within a quarter of a 64-lane wavefront, so the groups that leave the row
// loop at M leave whole and the ds_bpermute maximum of the others reads only active lanes.
template <int kIn>
__global__ __attribute__((amdgpu_flat_work_group_size(fp8gemm::kQuantThreads, fp8gemm::kQuantThreads))) void quantize_transposed_kernel(fp8gemm::QuantizeTransposedParams p) {
  __shared__ fp8gemm::TransposeTile tile;
  fp8gemm::quantize_transposed_tile<E4m3fnuzArch, kIn>(p, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                                                       __builtin_amdgcn_workitem_id_x(), tile);
}

// workgroup x: the column-block index (q_t's blocks, then the rows of no expert); workgroup y: the K block. The
// search's barriers are reached by every work-item; the tile's row groups leave whole as in quantize_transposed_kernel.
template <int kIn>
__global__ __attribute__((amdgpu_flat_work_group_size(fp8gemm::kQuantThreads, fp8gemm::kQuantThreads))) void quantize_grouped_transposed_kernel(fp8gemm::QuantizeGroupedParams p) {
  __shared__ fp8gemm::ExpertSearch search;
  __shared__ fp8gemm::TransposeTile tile;
  fp8gemm::quantize_grouped_tile<E4m3fnuzArch, kIn>(p, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                                                    __builtin_amdgcn_workitem_id_x(), search, tile);
}

// As quantize_grouped_transposed_kernel, the tile's rows computed by a row source (fp8gemm/backend.hpp RowSourceKind)
// as they are loaded; kGateIn: the SwiGLU backward's h kind (unused by the other sources).
template <int kSource, int kIn, int kGateIn>
__global__ __attribute__((amdgpu_flat_work_group_size(fp8gemm::kQuantThreads, fp8gemm::kQuantThreads))) void quantize_grouped_source_kernel(fp8gemm::QuantizeGroupedParams p) {
  __shared__ fp8gemm::ExpertSearch search;
  __shared__ fp8gemm::TransposeTile tile;
  fp8gemm::quantize_grouped_source_tile<E4m3fnuzArch, kSource, kIn, kGateIn>(
      p, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workitem_id_x(), search,
      tile);
}

// The instance for a source and its kinds (fp8gemm/quantize_sources.cuh visit_source_instance), or null.
const void* grouped_source_kernel(int source, int in_kind, int gate_up_kind) {
  const void* kernel = nullptr;
  fp8gemm::visit_source_instance(source, in_kind, gate_up_kind, [&](auto instance) {
    using I = decltype(instance);
    kernel = reinterpret_cast<const void*>(&quantize_grouped_source_kernel<I::source, I::in, I::gate_in>);
  });
  return kernel;
}

}  // namespace

int enqueue_quantize(const fp8gemm::QuantizeParams& p, int in_kind, void* stream) {
  const void* kernel = in_kind == fp8gemm::kInBF16   ? reinterpret_cast<const void*>(&quantize_kernel<fp8gemm::kInBF16>)
                       : in_kind == fp8gemm::kInFP16 ? reinterpret_cast<const void*>(&quantize_kernel<fp8gemm::kInFP16>)
                                                     : reinterpret_cast<const void*>(&quantize_kernel<fp8gemm::kInFP32>);
  fp8gemm::QuantizeParams params = p;
  void* args[] = {&params};
  const dim3 grid(static_cast<unsigned>((p.m + fp8gemm::kQuantRows - 1) / fp8gemm::kQuantRows),
                  static_cast<unsigned>(p.k / fp8gemm::kQuantBlock));
  return hipLaunchKernel(kernel, grid, dim3(fp8gemm::kQuantThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_quantize_transposed(const fp8gemm::QuantizeTransposedParams& p, int in_kind, int64_t row_blocks,
                                int64_t k_blocks, void* stream) {
  const void* kernel =
      in_kind == fp8gemm::kInBF16   ? reinterpret_cast<const void*>(&quantize_transposed_kernel<fp8gemm::kInBF16>)
      : in_kind == fp8gemm::kInFP16 ? reinterpret_cast<const void*>(&quantize_transposed_kernel<fp8gemm::kInFP16>)
                                    : reinterpret_cast<const void*>(&quantize_transposed_kernel<fp8gemm::kInFP32>);
  fp8gemm::QuantizeTransposedParams params = p;
  void* args[] = {&params};
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(k_blocks));
  return hipLaunchKernel(kernel, grid, dim3(fp8gemm::kQuantThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_quantize_grouped_transposed(const fp8gemm::QuantizeGroupedParams& p, int in_kind, int64_t tiles,
                                        int64_t k_blocks, void* stream) {
  const void* kernel =
      in_kind == fp8gemm::kInBF16   ? reinterpret_cast<const void*>(&quantize_grouped_transposed_kernel<fp8gemm::kInBF16>)
      : in_kind == fp8gemm::kInFP16 ? reinterpret_cast<const void*>(&quantize_grouped_transposed_kernel<fp8gemm::kInFP16>)
                                    : reinterpret_cast<const void*>(&quantize_grouped_transposed_kernel<fp8gemm::kInFP32>);
  fp8gemm::QuantizeGroupedParams params = p;
  void* args[] = {&params};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(k_blocks));
  return hipLaunchKernel(kernel, grid, dim3(fp8gemm::kQuantThreads), args, 0, static_cast<hipStream_t>(stream));
}

int enqueue_quantize_grouped_source(const fp8gemm::QuantizeGroupedParams& p, int source, int in_kind, int gate_up_kind,
                                    int64_t tiles, int64_t k_blocks, void* stream) {
  const void* kernel = grouped_source_kernel(source, in_kind, gate_up_kind);
  if (!kernel) return kNoSourceKernel;
  fp8gemm::QuantizeGroupedParams params = p;
  void* args[] = {&params};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(k_blocks));
  return hipLaunchKernel(kernel, grid, dim3(fp8gemm::kQuantThreads), args, 0, static_cast<hipStream_t>(stream));
}

}  // namespace fp8gemm_gfx942
