// The 128 x 96 tile in a translation unit of its own, for one ptxas option (CMakeLists.txt): DeepGEMM's
// --register-usage-level=10. On this kernel it measured 1.02-1.05x at 1024x1536x7168 in four in-process
// A/B runs (ci/gpu/inprocess_ab.py; bench/NOTES.md, twenty-second session); on every kernel it cost the
// 256-row ones ~1%.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

void launch_tiles_128x96(const fp8gemm::LaunchArgs& a, const Params& p, const Plan& plan, cudaStream_t stream, int dev) {
  launch_tiles<2, 96, 1>(a, p, plan, stream, dev);
}

}  // namespace fp8gemm_sm90a
