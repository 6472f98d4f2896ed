// C entry points of the emulated gfx942 backend: the package's own launch(), workspace_bytes() and
// quantize() (csrc/launch.cpp), with C++ exceptions turned into an error code and the emulator's last error.
#include <cstdint>
#include <exception>

#include "hip/hip_runtime_api.h"  // the kernel-language keywords of launch.hpp's headers, as launch.cpp has them
#include "launch.hpp"

extern "C" void gfx942_emu_set_last_error(const char* text);

extern "C" int fp8gemm_gfx942_emu_launch(uintptr_t a, uintptr_t b, uintptr_t a_scale, uintptr_t b_scale,
                                         uintptr_t out, uintptr_t workspace, int64_t m, int64_t n, int64_t k,
                                         int64_t lda, int64_t ldb, int64_t ldo, int64_t a_scale_ld,
                                         int64_t b_scale_ld, int out_kind, uintptr_t stream) {
  try {
    fp8gemm_gfx942::launch(fp8gemm::LaunchArgs{a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldo,
                                               a_scale_ld, b_scale_ld, out_kind, stream});
    return 0;
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return 1;
  }
}

extern "C" int64_t fp8gemm_gfx942_emu_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  try {
    return fp8gemm_gfx942::workspace_bytes(m, n, k);
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return -1;
  }
}

extern "C" int fp8gemm_gfx942_emu_quantize(uintptr_t x, uintptr_t q, uintptr_t scale, int64_t m, int64_t k, int64_t ldx,
                                           int64_t scale_ld, int in_kind, int pow2, uintptr_t stream) {
  try {
    fp8gemm_gfx942::quantize(fp8gemm::QuantizeArgs{x, q, scale, m, k, ldx, scale_ld, in_kind, pow2, stream});
    return 0;
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return 1;
  }
}
