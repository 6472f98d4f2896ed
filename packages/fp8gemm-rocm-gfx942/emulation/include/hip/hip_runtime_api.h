// The HIP runtime API subset that the host launcher (csrc/launch.cpp) and the kernels' enqueue
// functions use, served by the CPU emulator (src/hip_api.cpp) instead of libamdhip64.
#pragma once
#include <cstddef>

#include "hip/amd_detail/host_defines.h"

typedef enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidDeviceFunction = 98,
  hipErrorInvalidConfiguration = 9,
  hipErrorLaunchFailure = 719,
} hipError_t;

typedef enum hipDeviceAttribute_t {
  hipDeviceAttributeMultiprocessorCount = 63,
  hipDeviceAttributeWarpSize = 87,
} hipDeviceAttribute_t;

typedef struct ihipStream_t* hipStream_t;

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern "C" {
hipError_t hipGetDevice(int* device);
hipError_t hipSetDevice(int device);
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device);
const char* hipGetErrorString(hipError_t error);
hipError_t hipGetLastError(void);   // the last launch's error on this thread, then reset
hipError_t hipPeekAtLastError(void);
hipError_t hipLaunchKernel(const void* function, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                           hipStream_t stream);
}
