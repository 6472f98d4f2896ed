// Host side: the plan (heuristics.hpp), the launch of its tile (tile_launch.hpp) on the caller's stream,
// and the split-K reduction.
#include "fp8gemm/cuda/device.hpp"
#include "fp8gemm/cuda/reduce_splits.cuh"
#include "launch.hpp"
#include "tile_launch.hpp"

namespace fp8gemm_sm90a {
namespace {

constexpr fp8gemm::cuda::Devices kDevices("fp8gemm-cuda-sm90a");

TileLaunch launch_of(const TileConfig& tile) {
  const int index = tile_index(tile);
  if (index < 0) kDevices.fail("the plan names a tile that is not compiled");
  const TileLaunch launch = kTiles[index].unit == Unit::kRegisterLevel10 ? register_level10_unit_launch(index)
                                                                         : default_unit_launch(index);
  if (!launch) kDevices.fail("tile compiled in no translation unit");
  return launch;
}

}  // namespace

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return plan_for(m, n, k, kDevices.sm_count(kDevices.current())).workspace_bytes;
}

void launch(const fp8gemm::LaunchArgs& args) {
  const int dev = kDevices.current();
  const Plan plan = plan_for(args.m, args.n, args.k, kDevices.sm_count(dev));
  if (plan.splits > 1 && !args.workspace) kDevices.fail("split-K plan needs the workspace");
  Params p{};
  p.out = reinterpret_cast<void*>(args.out);
  p.partial = plan.splits > 1 ? reinterpret_cast<float*>(args.workspace) : nullptr;
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.ldo = args.ldo, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == fp8gemm::kOutFP32;
  p.kb_per_split = plan.kb_per_split, p.splits = plan.splits, p.m_blocks = plan.m_blocks, p.n_blocks = plan.n_blocks;
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  launch_of(plan.tile)(args, p, plan, stream, dev);
  kDevices.check(cudaGetLastError(), "GEMM kernel launch");
  if (plan.splits > 1) {
    fp8gemm::cuda::enqueue_reduce_splits(p.partial, p.out, p.m, p.n, p.ldo, plan.splits, p.out_fp32, 4 * kDevices.sm_count(dev),
                                   stream);
    kDevices.check(cudaGetLastError(), "split-K reduction launch");
  }
}

}  // namespace fp8gemm_sm90a
