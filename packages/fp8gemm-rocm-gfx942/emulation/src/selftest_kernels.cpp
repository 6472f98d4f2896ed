// Small kernels that pin down the emulator's own rules (tests/test_gfx942_emulation_units.py):
// LDS is shared by a workgroup and only by it, barriers order it, and a kernel that breaks barrier
// or wave-op discipline is reported instead of passing.
#include <cstring>

#include "gfx942_emu/kernels.hpp"
#include "hip/hip_runtime.h"

namespace {

__device__ unsigned tid() { return __builtin_amdgcn_workitem_id_x(); }
__device__ unsigned gid() { return __builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x() + tid(); }

// Every work-item publishes a value and reads another wave's: right only with a barrier between.
__global__ void lds_exchange(int* out, const int* in) {
  __shared__ int slots[1024];
  const unsigned n = __builtin_amdgcn_workgroup_size_x();
  slots[tid()] = in[gid()];
  __syncthreads();
  out[gid()] = slots[(tid() + 97) % n];
}

__global__ void lds_exchange_without_barrier(int* out, const int* in) {
  __shared__ int slots[1024];
  const unsigned n = __builtin_amdgcn_workgroup_size_x();
  slots[tid()] = in[gid()];
  out[gid()] = slots[(tid() + 97) % n];
}

__global__ void skips_barrier(int* out, const int*) {
  if (tid() == 77) return;
  __syncthreads();
  out[gid()] = 1;
}

__global__ void skips_one_of_two_barriers(int* out, const int*) {
  if (tid() != 5) __syncthreads();
  __syncthreads();
  out[gid()] = 1;
}

__global__ void barrier_without_fence(int* out, const int*) {
  __builtin_amdgcn_s_barrier();
  out[gid()] = 1;
}

// in: per lane a (2 ints), b (2 ints), c (16 floats); out: per lane d (16 floats).
__global__ void mfma_per_lane(int* out, const int* in) {
  typedef float floatx16 __attribute__((ext_vector_type(16)));
  const int* mine = in + 20 * gid();
  long a, b;
  std::memcpy(&a, mine, 8);
  std::memcpy(&b, mine + 2, 8);
  floatx16 c;
  std::memcpy(&c, mine + 4, 64);
  const floatx16 d = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(a, b, c, 0, 0, 0);
  std::memcpy(out + 16 * gid(), &d, 64);
}

__global__ void divergent_mfma(int* out, const int*) {
  typedef float floatx16 __attribute__((ext_vector_type(16)));
  floatx16 acc{};
  if (tid() % 64 < 32) acc = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(0l, 0l, acc, 0, 0, 0);
  out[gid()] = static_cast<int>(acc[0]);
}

// in: per work-item (byte address, value); out: what ds_bpermute returns.
__global__ void bpermute(int* out, const int* in) { out[gid()] = __builtin_amdgcn_ds_bpermute(in[2 * gid()], in[2 * gid() + 1]); }

// The maximum over each aligned group of 16 lanes, by butterfly exchanges (__shfl_xor, width 16).
__global__ void max_over_16_lanes(int* out, const int* in) {
  float x = __builtin_bit_cast(float, in[gid()]);
  for (int mask = 8; mask > 0; mask /= 2) {
    const float other = __shfl_xor(x, mask, 16);
    x = other > x ? other : x;
  }
  out[gid()] = __builtin_bit_cast(int, x);
}

// As above, with the last 16 lanes of every wave returned first (inactive for the exchanges).
__global__ void max_over_16_lanes_after_early_exit(int* out, const int* in) {
  if (tid() % 64 >= 48) return;
  max_over_16_lanes(out, in);
}

// Each 16-lane group g runs the maximum g % 4 times (so every wave holds groups that leave the loop after 0, 1, 2 and 3
// rounds), then all meet at a barrier: the groups that went on to it are inactive for the others' exchanges, as under
// EXEC (fp8gemm/quantize_tiles.cuh's row loop at M). out: the maximum, or the input where a group ran none.
__global__ void max_over_16_lanes_with_groups_at_a_barrier(int* out, const int* in) {
  float x = __builtin_bit_cast(float, in[gid()]);
  for (unsigned round = 0; round < tid() / 16 % 4; ++round) {
    for (int mask = 8; mask > 0; mask /= 2) {
      const float other = __shfl_xor(x, mask, 16);
      x = other > x ? other : x;
    }
  }
  __syncthreads();
  out[gid()] = __builtin_bit_cast(int, x);
}

// An MFMA that half of each wave skips for a barrier: still divergence (the instruction needs all 64 lanes).
__global__ void mfma_with_lanes_at_a_barrier(int* out, const int*) {
  typedef float floatx16 __attribute__((ext_vector_type(16)));
  floatx16 acc{};
  if (tid() % 64 < 32) acc = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(0l, 0l, acc, 0, 0, 0);
  __syncthreads();
  out[gid()] = static_cast<int>(acc[0]);
}

using Kernel = void (*)(int*, const int*);
struct Named {
  const char* name;
  Kernel kernel;
};
const Named kKernels[] = {
    {"lds_exchange", lds_exchange},       {"lds_exchange_without_barrier", lds_exchange_without_barrier},
    {"skips_barrier", skips_barrier},     {"skips_one_of_two_barriers", skips_one_of_two_barriers},
    {"barrier_without_fence", barrier_without_fence}, {"mfma_per_lane", mfma_per_lane},
    {"divergent_mfma", divergent_mfma},   {"bpermute", bpermute},
    {"max_over_16_lanes", max_over_16_lanes},
    {"max_over_16_lanes_after_early_exit", max_over_16_lanes_after_early_exit},
    {"max_over_16_lanes_with_groups_at_a_barrier", max_over_16_lanes_with_groups_at_a_barrier},
    {"mfma_with_lanes_at_a_barrier", mfma_with_lanes_at_a_barrier},
};

}  // namespace

GFX942_EMU_KERNEL(lds_exchange);
GFX942_EMU_KERNEL(lds_exchange_without_barrier);
GFX942_EMU_KERNEL(skips_barrier);
GFX942_EMU_KERNEL(skips_one_of_two_barriers);
GFX942_EMU_KERNEL(barrier_without_fence);
GFX942_EMU_KERNEL(mfma_per_lane);
GFX942_EMU_KERNEL(divergent_mfma);
GFX942_EMU_KERNEL(bpermute);
GFX942_EMU_KERNEL(max_over_16_lanes);
GFX942_EMU_KERNEL(max_over_16_lanes_after_early_exit);
GFX942_EMU_KERNEL(max_over_16_lanes_with_groups_at_a_barrier);
GFX942_EMU_KERNEL(mfma_with_lanes_at_a_barrier);

// Launches the named kernel on `groups` x `block` work-items: 0, 1 for an unknown name, else the
// hipError_t (the detail in gfx942_emu_last_error()).
extern "C" int gfx942_emu_selftest_launch(const char* name, unsigned groups, unsigned block, int* out, const int* in) {
  for (const Named& k : kKernels) {
    if (std::strcmp(k.name, name)) continue;
    void* args[] = {&out, &in};
    return hipLaunchKernel(reinterpret_cast<const void*>(k.kernel), dim3(groups), dim3(block), args, 0, nullptr);
  }
  return 1;
}
