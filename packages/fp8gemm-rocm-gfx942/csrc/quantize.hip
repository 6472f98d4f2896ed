// Activation quantization for gfx942: the core's portable kernel (fp8gemm/quantize_rows.cuh) with
// e4m3fnuz codes (bias 8, max 240), a 16-lane max through ds_bpermute, 256 work-items per workgroup.
#include "hip_compat.hpp"
#include "e4m3fnuz_arch.hpp"
#include "fp8gemm/quantize_rows.cuh"
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

}  // namespace fp8gemm_gfx942
