// The gfx942 device built-ins the kernels call, mapped onto the CPU emulator (src/device.cpp).
//
// Each work-item runs as a fiber; a workgroup's fibers share one OS thread, so `__shared__`
// (static thread_local) is one copy per workgroup in flight. Barriers and wave-level operations
// (MFMA, ds_bpermute) are rendezvous points: the emulator checks that every work-item of the
// workgroup (barrier) or every lane of the wavefront (wave op) reaches the same one.
#pragma once
#include <cstdint>

namespace gfx942_emu {

typedef float floatx16 __attribute__((ext_vector_type(16)));
constexpr int kWaveSize = 64;

unsigned workitem_id(int dim);
unsigned workgroup_id(int dim);
unsigned workgroup_size(int dim);
unsigned num_workgroups(int dim);
unsigned grid_size(int dim);  // in work-items, as the dispatch packet's grid_size
void fence(int order, const char* scope);
void s_barrier();
// acc: C in, D out (16 fp32 registers of this lane).
void mfma_lane_f32_32x32x16_fp8(int64_t a, int64_t b, float acc[16], int cbsz, int abid, int blgp);
int ds_bpermute(int byte_address, int value);
unsigned lane_id();

// Through memory, not a vector argument: the vector ABI depends on the host's AVX-512 flags.
__attribute__((always_inline)) inline floatx16 mfma_f32_32x32x16_fp8_fp8(int64_t a, int64_t b, floatx16 c, int cbsz,
                                                                         int abid, int blgp) {
  float acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = c[r];
  mfma_lane_f32_32x32x16_fp8(a, b, acc, cbsz, abid, blgp);
  floatx16 d;
  for (int r = 0; r < 16; ++r) d[r] = acc[r];
  return d;
}

}  // namespace gfx942_emu

// The clang AMDGPU built-ins, by name: kernel source calls them unchanged.
#define __builtin_amdgcn_workitem_id_x() (::gfx942_emu::workitem_id(0))
#define __builtin_amdgcn_workitem_id_y() (::gfx942_emu::workitem_id(1))
#define __builtin_amdgcn_workitem_id_z() (::gfx942_emu::workitem_id(2))
#define __builtin_amdgcn_workgroup_id_x() (::gfx942_emu::workgroup_id(0))
#define __builtin_amdgcn_workgroup_id_y() (::gfx942_emu::workgroup_id(1))
#define __builtin_amdgcn_workgroup_id_z() (::gfx942_emu::workgroup_id(2))
#define __builtin_amdgcn_workgroup_size_x() (::gfx942_emu::workgroup_size(0))
#define __builtin_amdgcn_workgroup_size_y() (::gfx942_emu::workgroup_size(1))
#define __builtin_amdgcn_workgroup_size_z() (::gfx942_emu::workgroup_size(2))
#define __builtin_amdgcn_grid_size_x() (::gfx942_emu::grid_size(0))
#define __builtin_amdgcn_grid_size_y() (::gfx942_emu::grid_size(1))
#define __builtin_amdgcn_grid_size_z() (::gfx942_emu::grid_size(2))
#define __builtin_amdgcn_fence(order, scope) (::gfx942_emu::fence((order), (scope)))
#define __builtin_amdgcn_s_barrier() (::gfx942_emu::s_barrier())
#define __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(a, b, c, cbsz, abid, blgp) \
  (::gfx942_emu::mfma_f32_32x32x16_fp8_fp8((a), (b), (c), (cbsz), (abid), (blgp)))
#define __builtin_amdgcn_ds_bpermute(address, value) (::gfx942_emu::ds_bpermute((address), (value)))
