// The CUDA side of activation quantization (fp8gemm/quantize_rows.cuh) and of quantization with a transpose, dense
// (fp8gemm/quantize_tiles.cuh) and per expert (fp8gemm/quantize_grouped_tiles.cuh), shared by every CUDA arch package:
// an arch's quantize.cu includes this and forwards its entries to launch_quantize, launch_quantize_transposed and
// launch_quantize_grouped_transposed.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/cuda/e4m3_arch.cuh"
#include "fp8gemm/quantize_grouped_launch.hpp"
#include "fp8gemm/quantize_grouped_tiles.cuh"
#include "fp8gemm/quantize_rows.cuh"
#include "fp8gemm/quantize_sources.cuh"
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
  // The tile kernels keep whole warps converged, so the shuffles take the full mask (no per-group collective code).
  static __device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int offset = kQuantLanes / 2; offset; offset >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
  }
};

// Quantization with a transpose, dense and per expert, persistent: each workgroup takes a run of tiles t (column block
// t / k_blocks, K block t % k_blocks), and its threads copy their rows of the next tile into shared memory (cp.async,
// rows past the tile's end zero-filled) while quantizing the current one from registers, so reads stay in flight
// through the quantizing and the stores (one tile a workgroup reached about half a device copy's rate).
template <int kIn>
struct StagedRows {  // [row of the thread][thread]: a warp's 16-byte pieces side by side, no bank conflicts
  RawRow<kIn> row[kTileRowsPerThread][kQuantThreads];
};

template <int kIn>
struct TransposedSmem {  // 57 KB for 16-bit inputs, 89 KB for fp32
  TransposeTile tile;
  StagedRows<kIn> stage;
};

__device__ __forceinline__ void copy16_async(void* smem, const uint8_t* gmem, bool present) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(present ? 16 : 0)
               : "memory");  // a source size of 0 writes zeros and reads nothing
}

// This thread's rows of the tile (rows, kb) into `stage`, as load_tile_rows would load them.
template <int kIn>
__device__ __forceinline__ void stage_tile_rows(const QuantizeTransposedParams& p, const TileRows& rows, int64_t kb,
                                                int tid, StagedRows<kIn>& stage) {
  constexpr int kPieces = sizeof(RawRow<kIn>) / 16;
  const int64_t row0 = rows.first + (tid / kQuantLanes) * kTileRowsPerThread;
  const uint8_t* src = p.x + row0 * p.ldx_bytes + (kb * kQuantBlock + (tid % kQuantLanes) * kQuantElems) * kInBytes<kIn>;
#pragma unroll
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    const bool present = row0 + i < rows.end;
    const uint8_t* row = present ? src + i * p.ldx_bytes : p.x;
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece)
      copy16_async(&stage.row[i][tid].w[4 * piece], row + 16 * piece, present);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The workgroup's run of tiles. rows_of(block, tid): the rows of column block `block`, called by every thread. A
// thread's staged rows are its own (copied and read by it alone), so one buffer and no barrier between them suffice,
// on the assumption that a thread's shared load completes before its next cp.async into the same bytes lands: PTX
// orders cp.async's writes only through wait_group, but the copy's global read alone outlasts the load. Checked on
// an H200 (bits against the reference); a barrier between the load and the copies would make it formal.
template <int kIn, class RowsOf>
__device__ __forceinline__ void quantize_run(const QuantizeTransposedParams& p, int64_t k_blocks, int64_t tiles,
                                             TransposedSmem<kIn>& smem, RowsOf rows_of) {
  const int tid = threadIdx.x;
  const int64_t first = tiles * blockIdx.x / gridDim.x, end = tiles * (blockIdx.x + 1) / gridDim.x;
  if (first >= end) return;
  int64_t block = first / k_blocks, kb = first % k_blocks;
  TileRows rows = rows_of(block, tid);
  stage_tile_rows<kIn>(p, rows, kb, tid, smem.stage);
  for (int64_t left = end - first; left > 0; --left) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    RawRow<kIn> raw[kTileRowsPerThread];
#pragma unroll
    for (int i = 0; i < kTileRowsPerThread; ++i) raw[i] = smem.stage.row[i][tid];
    TileRows next = rows;
    const bool last_k = kb + 1 == k_blocks;
    if (left > 1) {
      if (last_k) next = rows_of(block + 1, tid);
      stage_tile_rows<kIn>(p, next, last_k ? 0 : kb + 1, tid, smem.stage);
    }
    if (rows.transpose || rows.end > rows.first)  // uniform: a leftover index past the last row writes nothing
      quantize_loaded_rows<E4m3TileArch, kIn>(p, rows, kb, tid, smem.tile, raw);
    __syncthreads();  // the next tile reuses the shared tile
    rows = next;
    block += last_k, kb = last_k ? 0 : kb + 1;
  }
}

template <int kIn>
__global__ void __launch_bounds__(kQuantThreads, kIn == kInFP32 ? 1 : 2)
    quantize_transposed_kernel(QuantizeTransposedParams p, int64_t k_blocks, int64_t tiles) {
  extern __shared__ __align__(16) uint8_t smem_bytes[];
  quantize_run<kIn>(p, k_blocks, tiles, *reinterpret_cast<TransposedSmem<kIn>*>(smem_bytes),
                    [&](int64_t rb, int) { return TileRows{rb * kQuantBlock, p.m, rb, 1}; });
}

// Column-block indices: q_t's blocks, then the rows of no expert (fp8gemm/quantize_grouped_tiles.cuh). Two workgroups
// an SM for bf16 only: fp16's widening and the search's state do not fit 128 registers without spilling.
template <int kIn>
__global__ void __launch_bounds__(kQuantThreads, kIn == kInBF16 ? 2 : 1)
    quantize_grouped_transposed_kernel(QuantizeGroupedParams p, int64_t k_blocks, int64_t tiles) {
  extern __shared__ __align__(16) uint8_t smem_bytes[];
  __shared__ ExpertSearch search;
  tiles = k_blocks * grouped_blocks_used<E4m3TileArch>(p, threadIdx.x, search);  // the runs split the tiles with rows
  quantize_run<kIn>(p.tiles, k_blocks, tiles, *reinterpret_cast<TransposedSmem<kIn>*>(smem_bytes),
                    [&](int64_t block, int tid) { return grouped_tile_rows<E4m3TileArch>(p, block, tid, search); });
}

// The fused sources (fp8gemm/quantize_sources.cuh), persistent as quantize_run but loading each tile's rows straight
// into registers: their inputs are two or three times a plain tile's bytes, more than shared memory stages, so two
// workgroups an SM keep reads in flight instead.
template <int kSource, int kIn, int kGateIn>
__global__ void __launch_bounds__(kQuantThreads, 2)
    quantize_grouped_source_kernel(QuantizeGroupedParams p, int64_t k_blocks, int64_t tiles) {
  __shared__ ExpertSearch search;
  __shared__ TransposeTile tile;
  tiles = k_blocks * grouped_blocks_used<E4m3TileArch>(p, threadIdx.x, search);
  const int64_t first = tiles * blockIdx.x / gridDim.x, end = tiles * (blockIdx.x + 1) / gridDim.x;
  TileRows rows{};
  for (int64_t t = first; t < end; ++t) {
    const int64_t block = t / k_blocks, kb = t % k_blocks;
    if (t == first || kb == 0) rows = grouped_tile_rows<E4m3TileArch>(p, block, threadIdx.x, search);
    if (rows.transpose || rows.end > rows.first) {  // uniform: a leftover index past the last row writes nothing
      RawRow<kInFP32> raw[kTileRowsPerThread];
      load_source_rows<E4m3TileArch, kSource, kIn, kGateIn>(p, rows, kb, threadIdx.x, raw);
      quantize_loaded_rows<E4m3TileArch, kInFP32>(p.tiles, rows, kb, threadIdx.x, tile, raw);
    }
    __syncthreads();  // the next tile reuses the shared tile
  }
}

// Workgroups of `kernel` that fit the device at once (its shared memory allowed first), looked up once per device.
template <auto kernel, int kBytes>
int resident_blocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // host threads may launch at once: same value, no torn reads
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed))
    return cached[device].load(std::memory_order_relaxed);
  int sms = 0, per_sm = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kQuantThreads, kBytes) != cudaSuccess)
    return 0;
  const int blocks = sms * (per_sm > 0 ? per_sm : 1);
  if (device < kMaxDevices) cached[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <auto kernel, int kIn, class Params>
void launch_run(const Params& p, int64_t k_blocks, int64_t tiles, cudaStream_t stream, const char* what) {
  constexpr int kBytes = sizeof(TransposedSmem<kIn>);
  const int resident = resident_blocks<kernel, kBytes>();
  if (!resident) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(cudaGetLastError()));
  kernel<<<static_cast<unsigned>(tiles < resident ? tiles : resident), kQuantThreads, kBytes, stream>>>(p, k_blocks,
                                                                                                      tiles);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " kernel launch: " + cudaGetErrorString(err));
}

// The three input kinds' instances of one kernel template.
template <template <int> class Kernel, class Params>
void launch_by_kind(int in_kind, const Params& p, int64_t k_blocks, int64_t tiles, cudaStream_t stream,
                    const std::string& what) {
  switch (in_kind) {
    case kInBF16: return launch_run<Kernel<kInBF16>::kernel, kInBF16>(p, k_blocks, tiles, stream, what.c_str());
    case kInFP16: return launch_run<Kernel<kInFP16>::kernel, kInFP16>(p, k_blocks, tiles, stream, what.c_str());
    case kInFP32: return launch_run<Kernel<kInFP32>::kernel, kInFP32>(p, k_blocks, tiles, stream, what.c_str());
    default: throw std::invalid_argument(what + ": unknown input kind");
  }
}

template <auto kernel>
void launch_source_kernel(const QuantizeGroupedParams& p, int64_t k_blocks, int64_t tiles, cudaStream_t stream,
                          const std::string& what) {
  const int resident = resident_blocks<kernel, 0>();  // static shared memory only
  if (!resident) throw std::runtime_error(what + ": " + cudaGetErrorString(cudaGetLastError()));
  kernel<<<static_cast<unsigned>(tiles < resident ? tiles : resident), kQuantThreads, 0, stream>>>(p, k_blocks, tiles);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(what + " kernel launch: " + cudaGetErrorString(err));
}

// The source's kernel for the input kinds it takes (check_row_source refused the others).
inline void launch_source(const QuantizeGroupedTransposedArgs& a, const QuantizeGroupedParams& p, int64_t k_blocks,
                          int64_t tiles, cudaStream_t stream, const std::string& what) {
  const bool launched = visit_source_instance(a.source, a.in_kind, a.gate_up_kind, [&](auto instance) {
    using I = decltype(instance);
    launch_source_kernel<quantize_grouped_source_kernel<I::source, I::in, I::gate_in>>(p, k_blocks, tiles, stream, what);
  });
  if (!launched) throw std::invalid_argument(what + ": no kernel for source " + std::to_string(a.source));
}

template <int kIn>
struct DenseKernel {
  static constexpr auto kernel = quantize_transposed_kernel<kIn>;
};

template <int kIn>
struct GroupedKernel {
  static constexpr auto kernel = quantize_grouped_transposed_kernel<kIn>;
};

inline void launch_quantize_transposed(const QuantizeTransposedArgs& args, const char* package) {
  const int64_t k_blocks = args.k / kQuantBlock, tiles = k_blocks * ((args.m_t + kQuantBlock - 1) / kQuantBlock);
  if (!q_t_group_fits(args))
    throw std::invalid_argument(std::string(package) + ": quantize_transposed: q_t_group must be 0 or a multiple of "
                                "128 that divides m_t");
  if (tiles == 0) return;
  launch_by_kind<DenseKernel>(args.in_kind, quantize_transposed_params(args), k_blocks, tiles,
                              reinterpret_cast<cudaStream_t>(args.stream), std::string(package) + ": quantize_transposed");
}

inline void launch_quantize_grouped_transposed(const QuantizeGroupedTransposedArgs& args, const char* package) {
  check_grouped_quantize_args(args, package);
  const int64_t k_blocks = args.k / kQuantBlock, tiles = k_blocks * grouped_tile_count(args.m, args.columns);
  if (tiles == 0) return;
  const std::string what = std::string(package) + ": quantize_grouped_transposed";
  const auto stream = reinterpret_cast<cudaStream_t>(args.stream);
  if (args.source != kSourceRows) return launch_source(args, quantize_grouped_params(args), k_blocks, tiles, stream, what);
  launch_by_kind<GroupedKernel>(args.in_kind, quantize_grouped_params(args), k_blocks, tiles, stream, what);
}

}  // namespace
}  // namespace fp8gemm::cuda
