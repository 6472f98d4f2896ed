// What the device code needs from HIP: the runtime headers under hipcc (FP8GEMM_HIP_HEADERS), or the
// few declarations below for a bare clang++ -nogpuinc (CI, Debian's clang-19).
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(FP8GEMM_HIP_HEADERS)
#include <hip/hip_runtime.h>
#else
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
typedef struct ihipStream_t* hipStream_t;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern "C" int hipLaunchKernel(const void* function, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                               hipStream_t stream);
#endif

