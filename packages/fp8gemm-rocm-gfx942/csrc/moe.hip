// The mixture-of-experts step kernels for gfx942: the core's portable steps (fp8gemm/moe_steps.cuh) on the
// e4m3fnuz Arch of the quantizer, 256 work-items per workgroup.
#include "hip_compat.hpp"
#include "e4m3fnuz_arch.hpp"
#include "fp8gemm/moe_steps.cuh"
#include "launch.hpp"

namespace fp8gemm_gfx942 {
namespace {

using MoeArch = E4m3fnuzArch;  // its exp serves the activation step

#define FP8GEMM_MOE_KERNEL __global__ __attribute__((amdgpu_flat_work_group_size(fp8gemm::kMoeThreads, fp8gemm::kMoeThreads)))

// workgroup x: a chunk of tokens.
FP8GEMM_MOE_KERNEL void moe_count_kernel(fp8gemm::MoeRouteParams p) {
  __shared__ fp8gemm::MoeRouteShared s;
  fp8gemm::moe_count_chunk<MoeArch>(p, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workitem_id_x(), s);
}

FP8GEMM_MOE_KERNEL void moe_route_kernel(fp8gemm::MoeRouteParams p) {
  __shared__ fp8gemm::MoeRouteShared s;
  fp8gemm::moe_route_chunk<MoeArch>(p, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workitem_id_x(), s);
}

// workgroup x: kMoeGroups (token, K block) items.
FP8GEMM_MOE_KERNEL void moe_scatter_kernel(fp8gemm::MoeRouteParams p) {
  const int64_t item = int64_t(__builtin_amdgcn_workgroup_id_x()) * fp8gemm::kMoeGroups +
                       __builtin_amdgcn_workitem_id_x() / fp8gemm::kQuantLanes;
  if (item >= p.tokens * (p.hidden / fp8gemm::kQuantBlock)) return;  // whole 16-lane groups leave together
  fp8gemm::moe_scatter_group<MoeArch>(p, item, __builtin_amdgcn_workitem_id_x() % fp8gemm::kQuantLanes);
}

// workgroup x: kMoeGroups rows; workgroup y: the K block of I.
FP8GEMM_MOE_KERNEL void moe_activation_kernel(fp8gemm::MoeActivationParams p) {
  const int64_t row = int64_t(__builtin_amdgcn_workgroup_id_x()) * fp8gemm::kMoeGroups +
                      __builtin_amdgcn_workitem_id_x() / fp8gemm::kQuantLanes;
  if (row >= fp8gemm::moe_active_rows(p)) return;  // whole 16-lane groups leave together
  fp8gemm::moe_activation_group<MoeArch>(p, row, __builtin_amdgcn_workgroup_id_y(),
                                         __builtin_amdgcn_workitem_id_x() % fp8gemm::kQuantLanes);
}

// workgroup x: a token and kMoeThreads * p.combine_cols of its columns.
FP8GEMM_MOE_KERNEL void moe_combine_kernel(fp8gemm::MoeCombineParams p) {
  const int64_t per_token = p.combine_blocks;
  const int64_t group = __builtin_amdgcn_workgroup_id_x(), token = group / per_token;
  const int64_t col =
      ((group % per_token) * fp8gemm::kMoeThreads + __builtin_amdgcn_workitem_id_x()) * p.combine_cols;
  if (col < p.hidden) fp8gemm::moe_combine_item(p, token, col);
}

template <class Params>
int launch_moe_kernel(const void* kernel, dim3 grid, const Params& p, void* stream) {
  Params params = p;
  void* args[] = {&params};
  return hipLaunchKernel(kernel, grid, dim3(fp8gemm::kMoeThreads), args, 0, static_cast<hipStream_t>(stream));
}

}  // namespace

int enqueue_moe_route(const fp8gemm::MoeRouteParams& p, int64_t count_blocks, int64_t blocks, void* stream) {
  if (count_blocks) {
    const int err = launch_moe_kernel(reinterpret_cast<const void*>(&moe_count_kernel),
                                      dim3(static_cast<unsigned>(count_blocks)), p, stream);
    if (err) return err;
  }
  const int err =
      launch_moe_kernel(reinterpret_cast<const void*>(&moe_route_kernel), dim3(static_cast<unsigned>(blocks)), p, stream);
  if (err) return err;
  const auto scatter = static_cast<unsigned>(fp8gemm::moe_scatter_blocks(p.tokens, p.hidden));
  return launch_moe_kernel(reinterpret_cast<const void*>(&moe_scatter_kernel), dim3(scatter), p, stream);
}

int enqueue_moe_activation(const fp8gemm::MoeActivationParams& p, int64_t k_blocks, int64_t row_groups, void* stream) {
  // rows in x: HIP's x dimension takes 2^32 work-items
  return launch_moe_kernel(reinterpret_cast<const void*>(&moe_activation_kernel),
                           dim3(static_cast<unsigned>(row_groups), static_cast<unsigned>(k_blocks)), p, stream);
}

int enqueue_moe_combine(const fp8gemm::MoeCombineParams& p, int64_t blocks, void* stream) {
  return launch_moe_kernel(reinterpret_cast<const void*>(&moe_combine_kernel), dim3(static_cast<unsigned>(blocks)), p,
                           stream);
}

}  // namespace fp8gemm_gfx942
