// Host side: picks the plan (heuristics.hpp), launches the kernel(s) on the caller's stream.
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "gemm_kernel.cuh"
#include "launch.hpp"

namespace fp8gemm_sm120 {
namespace {

constexpr int kMaxDevices = 64;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("fp8gemm-cuda-sm120: ") + what + ": " + cudaGetErrorString(err));
}

int current_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices) throw std::runtime_error("fp8gemm-cuda-sm120: device index out of range");
  return dev;
}

int sm_count(int dev) {
  static int cached[kMaxDevices] = {};
  if (!cached[dev]) check(cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev), "SM count");
  return cached[dev];
}

template <int WARPS_M, int STAGES>
void launch_tiles(const Params& p, int m, int n, int splits, cudaStream_t stream, int dev) {
  using T = Traits<WARPS_M, STAGES>;
  static std::once_flag configured[kMaxDevices];  // the >48 KB shared-memory opt-in is per device
  std::call_once(configured[dev], [] {
    check(cudaFuncSetAttribute(gemm_kernel<WARPS_M, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
          "cudaFuncSetAttribute");
  });
  const dim3 grid(ceil_div(n, kBlockN), ceil_div(m, T::kBlockM), splits);
  gemm_kernel<WARPS_M, STAGES><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
}

}  // namespace

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k) { return workspace_bytes(m, n, k, sm_count(current_device())); }

void launch(const fp8gemm::LaunchArgs& args) {
  const int dev = current_device();
  const Plan plan = plan_for(args.m, args.n, args.k, sm_count(dev));
  const int kb_total = static_cast<int>(args.k / kBlockK);
  const int kb_per_split = ceil_div(kb_total, plan.split_k);
  const int splits = ceil_div(kb_total, kb_per_split);  // every split gets at least one K block
  if (splits > 1 && !args.workspace) throw std::runtime_error("fp8gemm-cuda-sm120: split-K plan needs the workspace");
  Params p{};
  p.a = reinterpret_cast<const uint8_t*>(args.a);
  p.b = reinterpret_cast<const uint8_t*>(args.b);
  p.a_scale = reinterpret_cast<const float*>(args.a_scale);
  p.b_scale = reinterpret_cast<const float*>(args.b_scale);
  p.out = reinterpret_cast<void*>(args.out);
  p.partial = splits > 1 ? reinterpret_cast<float*>(args.workspace) : nullptr;
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.lda = args.lda, p.ldb = args.ldb, p.ldo = args.ldo, p.sa_ld = args.a_scale_ld, p.sb_ld = args.b_scale_ld;
  p.out_fp32 = args.out_kind == fp8gemm::kOutFP32;
  p.kb_per_split = kb_per_split;
  auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (plan.config == TileConfig::M64)
    launch_tiles<1, 4>(p, p.m, p.n, splits, stream, dev);
  else
    launch_tiles<2, 3>(p, p.m, p.n, splits, stream, dev);
  check(cudaGetLastError(), "GEMM kernel launch");
  if (splits > 1) {
    const int64_t quads = args.m * args.n / 4;
    const int blocks = static_cast<int>(std::min<int64_t>((quads + 255) / 256, 8 * sm_count(dev)));
    reduce_splits<<<blocks, 256, 0, stream>>>(p.partial, p.out, p.m, p.n, p.ldo, splits, p.out_fp32);
    check(cudaGetLastError(), "split-K reduction launch");
  }
}

}  // namespace fp8gemm_sm120
