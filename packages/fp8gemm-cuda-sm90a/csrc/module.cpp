// Python binding: the protocol's module (fp8gemm/backend_module.hpp), no libtorch.
#include <cuda_runtime_api.h>

#include <string>

#include "fp8gemm/backend_module.hpp"
#include "heuristics.hpp"
#include "launch.hpp"

namespace {

// The FP8GEMM_SM90A_TILE values this build accepts ("consumers,block_n[,cluster]"), cluster 1 first:
// what tests and ci/gpu/tune.py force one at a time.
std::string compiled_tiles() {
  std::string tiles;
  for (const int cluster : {1, 2})
    for (int consumers = 1; consumers <= 4; ++consumers)
      for (int block_n = 16; block_n <= 192; block_n += 16)
        if (fp8gemm_sm90a::tile_supported(consumers, block_n, cluster))
          tiles += (tiles.empty() ? "" : " ") + std::to_string(consumers) + "," + std::to_string(block_n) +
                   (cluster > 1 ? "," + std::to_string(cluster) : "");
  return tiles;
}

pybind11::dict build_info() {
  pybind11::dict info;
  info["compiler"] = FP8GEMM_CUDA_COMPILER;
  info["cuda_runtime"] = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info["arch_flags"] = FP8GEMM_ARCH_FLAGS;
  info["targets"] = FP8GEMM_TARGETS;
  info["tiles"] = compiled_tiles();
  info["kernel"] = "wgmma m64nNk32 e4m3 (N 16..192, multiples of 16), TMA + mbarrier pipeline, warp-specialised, persistent, "
                   "tile chosen by a wave model, split-K for small M";
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_backend_module(m, &fp8gemm_sm90a::launch, &fp8gemm_sm90a::workspace_bytes, &build_info);
  fp8gemm::define_quantize_entry(m, &fp8gemm_sm90a::quantize);
}
