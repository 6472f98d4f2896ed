// The CUDA side of activation quantization (fp8gemm/quantize_rows.cuh) and of quantization with a transpose, dense
// (fp8gemm/quantize_tiles.cuh) and per expert (fp8gemm/quantize_grouped_tiles.cuh), shared by every CUDA arch package:
// an arch's quantize.cu includes this and forwards its entries to launch_quantize, launch_quantize_transposed and
// launch_quantize_grouped_transposed.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/cuda/e4m3_arch.cuh"
#include "fp8gemm/quantize_grouped_launch.hpp"
#include "fp8gemm/quantize_grouped_tiles.cuh"
#include "fp8gemm/quantize_rows.cuh"
#include "fp8gemm/quantize_tiles.cuh"

namespace fp8gemm::cuda {
// Internal linkage: one library may link several arch packages, each with its own copy of these kernels.
namespace {

// blockIdx.x: the K block; blockIdx.y: kQuantRows rows (grid-strided past 65535 of them).
template <int kIn>
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(QuantizeParams p) {
  asm volatile("griddepcontrol.launch_dependents;");  // a GEMM launched next may start its prologue now
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * kQuantRows + threadIdx.x / kQuantLanes; row < p.m;
       row += static_cast<int64_t>(gridDim.y) * kQuantRows)
    quantize_group<E4m3Arch, kIn>(p, row, blockIdx.x, threadIdx.x % kQuantLanes);  // 16-lane groups stay whole
}

inline void launch_quantize(const QuantizeArgs& args, const char* package) {
  const QuantizeParams p = quantize_params(args);
  const int64_t k_blocks = args.k / kQuantBlock, row_blocks = (args.m + kQuantRows - 1) / kQuantRows;
  if (k_blocks > 0x7fffffff) throw std::invalid_argument(std::string(package) + ": quantize: K too large for one launch");
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  const dim3 grid(static_cast<unsigned>(k_blocks), static_cast<unsigned>(row_blocks < 65535 ? row_blocks : 65535));
  const dim3 block(kQuantThreads);
  switch (args.in_kind) {
    case kInBF16: quantize_kernel<kInBF16><<<grid, block, 0, stream>>>(p); break;
    case kInFP16: quantize_kernel<kInFP16><<<grid, block, 0, stream>>>(p); break;
    case kInFP32: quantize_kernel<kInFP32><<<grid, block, 0, stream>>>(p); break;
    default: throw std::invalid_argument(std::string(package) + ": quantize: unknown input kind");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(package) + ": quantize kernel launch: " + cudaGetErrorString(err));
}

struct E4m3TileArch : E4m3Arch {
  static __device__ __forceinline__ void barrier() { __syncthreads(); }
};

// blockIdx.x: the K block; blockIdx.y: the 128-row block (grid-strided past 65535 of them).
template <int kIn>
__global__ void __launch_bounds__(kQuantThreads) quantize_transposed_kernel(QuantizeTransposedParams p) {
  __shared__ TransposeTile tile;
  const int64_t row_blocks = (p.m_t + kQuantBlock - 1) / kQuantBlock;
  for (int64_t rb = blockIdx.y; rb < row_blocks; rb += gridDim.y) {
    quantize_transposed_tile<E4m3TileArch, kIn>(p, rb, blockIdx.x, threadIdx.x, tile);
    __syncthreads();  // the next tile reuses the shared memory
  }
}

inline void launch_quantize_transposed(const QuantizeTransposedArgs& args, const char* package) {
  const QuantizeTransposedParams p = quantize_transposed_params(args);
  const int64_t k_blocks = args.k / kQuantBlock, row_blocks = (args.m_t + kQuantBlock - 1) / kQuantBlock;
  if (k_blocks > 0x7fffffff)
    throw std::invalid_argument(std::string(package) + ": quantize_transposed: K too large for one launch");
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  const dim3 grid(static_cast<unsigned>(k_blocks), static_cast<unsigned>(row_blocks < 65535 ? row_blocks : 65535));
  switch (args.in_kind) {
    case kInBF16: quantize_transposed_kernel<kInBF16><<<grid, kQuantThreads, 0, stream>>>(p); break;
    case kInFP16: quantize_transposed_kernel<kInFP16><<<grid, kQuantThreads, 0, stream>>>(p); break;
    case kInFP32: quantize_transposed_kernel<kInFP32><<<grid, kQuantThreads, 0, stream>>>(p); break;
    default: throw std::invalid_argument(std::string(package) + ": quantize_transposed: unknown input kind");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(package) + ": quantize_transposed kernel launch: " + cudaGetErrorString(err));
}

// blockIdx.x: the column-block index (q_t's blocks, then the rows of no expert); blockIdx.y: the K block. One tile a
// block: no loop keeps the tile's registers free of the loop's state.
template <int kIn>
__global__ void __launch_bounds__(kQuantThreads) quantize_grouped_transposed_kernel(QuantizeGroupedParams p) {
  __shared__ ExpertSearch search;
  __shared__ TransposeTile tile;
  quantize_grouped_tile<E4m3TileArch, kIn>(p, blockIdx.x, blockIdx.y, threadIdx.x, search, tile);
}

inline void launch_quantize_grouped_transposed(const QuantizeGroupedTransposedArgs& args, const char* package) {
  check_grouped_quantize_args(args, package);
  const QuantizeGroupedParams p = quantize_grouped_params(args);
  const int64_t k_blocks = args.k / kQuantBlock, tiles = grouped_tile_count(args.m, args.columns);
  if (tiles > 0x7fffffff || k_blocks > 65535)
    throw std::invalid_argument(std::string(package) + ": quantize_grouped_transposed: too many rows or K blocks for "
                                "one launch");
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(k_blocks));
  switch (args.in_kind) {
    case kInBF16: quantize_grouped_transposed_kernel<kInBF16><<<grid, kQuantThreads, 0, stream>>>(p); break;
    case kInFP16: quantize_grouped_transposed_kernel<kInFP16><<<grid, kQuantThreads, 0, stream>>>(p); break;
    case kInFP32: quantize_grouped_transposed_kernel<kInFP32><<<grid, kQuantThreads, 0, stream>>>(p); break;
    default: throw std::invalid_argument(std::string(package) + ": quantize_grouped_transposed: unknown input kind");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(package) + ": quantize_grouped_transposed kernel launch: " +
                             cudaGetErrorString(err));
}

}  // namespace
}  // namespace fp8gemm::cuda
