// Which SM each CTA of a one-wave grid lands on: a plain launch, a launch with a cluster-dimension attribute of 1,
// and 2-CTA clusters (the attribute alone changes the placement: bench/results/sm90a_cta_placement_h200_2026-11-24.txt).
// nvcc -O2 -arch=sm_90a -o /tmp/cta_placement ci/gpu/cta_placement.cu && /tmp/cta_placement [grid]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void record_sm(int* sm_of_cta) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) sm_of_cta[blockIdx.x] = static_cast<int>(sm);
  // Hold the SM, so that every CTA of the wave is resident at once and none reuses an SM.
  const long long start = clock64();
  while (clock64() - start < 2000000) {
  }
}

int main(int argc, char** argv) {
  const int grid = argc > 1 ? std::atoi(argv[1]) : 128;
  const int smem = 200 * 1024;  // one CTA per SM, as the GEMM kernels
  int* sm_of_cta;
  cudaMalloc(&sm_of_cta, grid * sizeof(int));
  cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const char* modes[] = {"plain", "cluster-attribute-1", "cluster-2"};
  for (int mode = 0; mode < 3; ++mode) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = mode == 2 ? 2 : 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = mode == 0 ? 0 : 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, record_sm, sm_of_cta);
    cudaDeviceSynchronize();
    std::vector<int> sms(grid);
    cudaMemcpy(sms.data(), sm_of_cta, grid * sizeof(int), cudaMemcpyDeviceToHost);
    std::printf("%s (%s): SM of CTA 0..%d:", modes[mode], cudaGetErrorString(err), grid - 1);
    for (int sm : sms) std::printf(" %d", sm);
    std::printf("\n");
  }
  return 0;
}
