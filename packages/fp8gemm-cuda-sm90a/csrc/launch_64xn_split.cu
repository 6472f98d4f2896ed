// The 64 x 16 and 64 x 32 tiles whose K blocks are split over two consumer warpgroups (the decode plans),
// in a translation unit of their own for one ptxas option (CMakeLists.txt): DeepGEMM's
// --register-usage-level=10. Measured in three in-process A/B runs against the default (ci/gpu/inprocess_ab.py;
// bench/NOTES.md, twenty-second and twenty-third sessions): 1.02x geomean over eight M <= 128 shapes in the
// longest (16 rounds, faster in 10-15 of them on every shape), 128x2112x7168 1.05x in both later runs.
#include "launch_tiles.cuh"

namespace fp8gemm_sm90a {

void launch_tiles_64x16_wg_split(const fp8gemm::LaunchArgs& a, const Params& p, const Plan& plan, cudaStream_t stream,
                                 int dev) {
  launch_tiles<1, 16, 1, 1, false, true>(a, p, plan, stream, dev);
}

void launch_tiles_64x32_wg_split(const fp8gemm::LaunchArgs& a, const Params& p, const Plan& plan, cudaStream_t stream,
                                 int dev) {
  launch_tiles<1, 32, 1, 1, false, true>(a, p, plan, stream, dev);
}

}  // namespace fp8gemm_sm90a
