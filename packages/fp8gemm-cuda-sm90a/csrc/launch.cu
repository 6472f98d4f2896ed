// Host side: the plan (heuristics.hpp) and its launch on the caller's stream (launch_tiles.cuh).
#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "launch_tiles.cuh"
#include "reduce_splits.cuh"

namespace fp8gemm_sm90a {
namespace {

int current_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices) throw std::runtime_error("fp8gemm-cuda-sm90a: device index out of range");
  return dev;
}

int sm_count(int dev) {
  static int cached[kMaxDevices] = {};
  if (!cached[dev]) check(cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev), "SM count");
  return cached[dev];
}

// One instantiation per tile_supported() shape, 128 x 128 on the one-set loop, and 64 x 16 and 64 x 32 with
// the K blocks split over two warpgroups. The 128 x 96 and the split tiles are compiled in translation units
// of their own (launch_128x96.cu, launch_64xn_split.cu) for a ptxas option.
// The plan counts 64-row slices: 4 runs as two consumer warpgroups of two slices each (256-row tiles).
void launch_plan(const Plan& plan, const fp8gemm::LaunchArgs& args, const Params& p, cudaStream_t stream, int dev) {
  const int key = plan.consumers * 10000 + plan.block_n * 10 + plan.cluster;
  if (plan.one_set_loop) {
    if (key != 21281) throw std::logic_error("fp8gemm-cuda-sm90a: the one-set loop is compiled for 128 x 128 tiles only");
    return launch_tiles<2, 128, 1, 1, true>(args, p, plan, stream, dev);
  }
  if (plan.split_k_warpgroups) {
    switch (key) {
      case 10161: return launch_tiles_64x16_wg_split(args, p, plan, stream, dev);
      case 10321: return launch_tiles_64x32_wg_split(args, p, plan, stream, dev);
      default: throw std::logic_error("fp8gemm-cuda-sm90a: the warpgroup K split is compiled for 64 x 16 and 64 x 32 tiles");
    }
  }
  switch (key) {
    case 10161: return launch_tiles<1, 16, 1>(args, p, plan, stream, dev);
    case 10321: return launch_tiles<1, 32, 1>(args, p, plan, stream, dev);
    case 10641: return launch_tiles<1, 64, 1>(args, p, plan, stream, dev);
    case 10961: return launch_tiles<1, 96, 1>(args, p, plan, stream, dev);
    case 11281: return launch_tiles<1, 128, 1>(args, p, plan, stream, dev);
    case 20641: return launch_tiles<2, 64, 1>(args, p, plan, stream, dev);
    case 20961: return launch_tiles_128x96(args, p, plan, stream, dev);
    case 21281: return launch_tiles<2, 128, 1>(args, p, plan, stream, dev);
    case 21282: return launch_tiles<2, 128, 2>(args, p, plan, stream, dev);
    case 21601: return launch_tiles<2, 160, 1>(args, p, plan, stream, dev);
    case 21921: return launch_tiles<2, 192, 1>(args, p, plan, stream, dev);
    case 31281: return launch_tiles<3, 128, 1>(args, p, plan, stream, dev);
    case 41281: return launch_tiles<2, 128, 1, 2>(args, p, plan, stream, dev);
    case 41282: return launch_tiles<2, 128, 2, 2>(args, p, plan, stream, dev);
    default: throw std::logic_error("fp8gemm-cuda-sm90a: plan names a tile that is not compiled");
  }
}

}  // namespace

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Experiments: FP8GEMM_SM90A_TILE="consumers,block_n[,cluster]", FP8GEMM_SM90A_SPLITS=n,
// FP8GEMM_SM90A_GROUP_M=n, FP8GEMM_SM90A_NO_PAIRS=1 and FP8GEMM_SM90A_WG_SPLIT_MIN_KB=n (64 x 16 and
// 64 x 32 tiles split their K blocks over two warpgroups from n per tile) force the plan's choices
// (read once per process); a tile launch.cu does not instantiate is an error.
const Tuning& tuning() {
  static const Tuning t = [] {
    Tuning t;
    if (const char* tile = std::getenv("FP8GEMM_SM90A_TILE"); tile && *tile) {
      t.cluster = 1;
      if (std::sscanf(tile, "%d,%d,%d", &t.consumers, &t.block_n, &t.cluster) < 2 ||
          !tile_supported(t.consumers, t.block_n, t.cluster))
        throw std::runtime_error(std::string("fp8gemm-cuda-sm90a: FP8GEMM_SM90A_TILE=") + tile +
                                 " is not a compiled tile (see heuristics.hpp tile_supported)");
    }
    t.splits = std::max(0, env_int("FP8GEMM_SM90A_SPLITS", 0));
    t.group_m = std::max(0, env_int("FP8GEMM_SM90A_GROUP_M", 0));
    t.no_pairs = env_int("FP8GEMM_SM90A_NO_PAIRS", 0) != 0;
    t.wg_split_min_kb = std::max(0, env_int("FP8GEMM_SM90A_WG_SPLIT_MIN_KB", 0));
    return t;
  }();
  return t;
}

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return plan_for(m, n, k, sm_count(current_device()), tuning()).workspace_bytes;
}

void launch(const fp8gemm::LaunchArgs& args) {
  const int dev = current_device();
  const Plan plan = plan_for(args.m, args.n, args.k, sm_count(dev), tuning());
  if (plan.splits > 1 && !args.workspace) throw std::runtime_error("fp8gemm-cuda-sm90a: split-K plan needs the workspace");
  Params p{};
  p.out = reinterpret_cast<void*>(args.out);
  p.partial = plan.splits > 1 ? reinterpret_cast<float*>(args.workspace) : nullptr;
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.ldo = args.ldo, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == fp8gemm::kOutFP32;
  p.kb_per_split = plan.kb_per_split, p.splits = plan.splits, p.m_blocks = plan.m_blocks, p.n_blocks = plan.n_blocks;
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  launch_plan(plan, args, p, stream, dev);
  check(cudaGetLastError(), "GEMM kernel launch");
  if (plan.splits > 1) {
    const int64_t quads = args.m * args.n / 4;
    const int blocks = static_cast<int>(std::min<int64_t>((quads + 255) / 256, 4 * sm_count(dev)));
    reduce_splits<<<blocks, 256, 0, stream>>>(p.partial, p.out, p.m, p.n, p.ldo, plan.splits, p.out_fp32);
    check(cudaGetLastError(), "split-K reduction launch");
  }
}

}  // namespace fp8gemm_sm90a
