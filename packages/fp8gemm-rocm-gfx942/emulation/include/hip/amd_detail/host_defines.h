// The kernel-language keywords on the emulator, where HIP's own <hip/amd_detail/host_defines.h>
// defines them: reached through <hip/hip_runtime_api.h>, so host code (csrc/launch.cpp) may include
// headers written for both sides (fp8gemm/quantize_rows.cuh), as with the real runtime headers.
#pragma once

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// An AMDGPU kernel attribute that host compilers reject; launches check the block size instead.
#define amdgpu_flat_work_group_size(min, max)
// LDS: one copy per OS thread, and an OS thread runs one workgroup's work-items (fibers) at a time.
#define __shared__ static thread_local
