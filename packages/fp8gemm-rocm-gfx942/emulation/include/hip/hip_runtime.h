// <hip/hip_runtime.h> for the CPU emulator: the device functions the kernels use and, through the
// emulated runtime API, the kernel-language keywords. Kernel sources compile unchanged against it
// (they take their FP8GEMM_HIP_HEADERS path, as under hipcc).
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>

#include "gfx942_emu/device.hpp"
#include "gfx942_emu/kernels.hpp"
#include "hip/hip_runtime_api.h"

#define warpSize 64

__device__ inline void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

__device__ inline unsigned __lane_id() { return ::gfx942_emu::lane_id(); }

// HIP's own definition (amd_warp_functions.h): a backward permute within `width`-lane segments.
__device__ inline int __shfl_xor(int var, int lane_mask, int width = warpSize) {
  const int self = static_cast<int>(__lane_id());
  const int index = self ^ lane_mask;
  const int source = index >= ((self + width) & ~(width - 1)) ? self : index;
  return __builtin_amdgcn_ds_bpermute(source << 2, var);
}

__device__ inline float __shfl_xor(float var, int lane_mask, int width = warpSize) {
  return __builtin_bit_cast(float, __shfl_xor(__builtin_bit_cast(int, var), lane_mask, width));
}

template <class T>
__device__ inline T __ldg(const T* p) {
  return *p;
}

// threadIdx, blockIdx, blockDim, gridDim: each component reads the current work-item's value.
namespace gfx942_emu {
template <unsigned (*Read)(int)>
struct Coordinates {
  struct Component {
    int dim;
    operator unsigned() const { return Read(dim); }
  };
  Component x{0}, y{1}, z{2};
};
}  // namespace gfx942_emu
static const gfx942_emu::Coordinates<&gfx942_emu::workitem_id> threadIdx{};
static const gfx942_emu::Coordinates<&gfx942_emu::workgroup_id> blockIdx{};
static const gfx942_emu::Coordinates<&gfx942_emu::workgroup_size> blockDim{};
static const gfx942_emu::Coordinates<&gfx942_emu::num_workgroups> gridDim{};

// HIP's typed launch: the arguments converted to the kernel's parameter types, passed by address.
template <class... P, class... A>
inline void hipLaunchKernelGGL(void (*kernel)(P...), dim3 grid, dim3 block, unsigned shared_bytes, hipStream_t stream,
                               A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "hipLaunchKernelGGL: wrong number of kernel arguments");
  gfx942_emu::register_kernel(kernel, "a kernel launched by hipLaunchKernelGGL");
  std::tuple<std::decay_t<P>...> values(std::forward<A>(args)...);
  std::apply(
      [&](auto&... v) {
        void* pointers[] = {static_cast<void*>(&v)..., nullptr};
        hipLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, pointers, shared_bytes, stream);
      },
      values);
}
