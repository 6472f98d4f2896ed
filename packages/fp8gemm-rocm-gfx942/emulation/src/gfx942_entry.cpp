// C entry points of the emulated gfx942 backend: the package's own launch(), workspace_bytes(), quantize(),
// grouped_launch(), grouped_workspace_bytes(), moe_step() and moe_workspace_bytes() (csrc/launch.cpp) behind the protocol's argument structs (read and checked as the package's
// module reads them), with C++ exceptions turned into an error code and the emulator's last error.
#include <cstdint>
#include <exception>

#include "hip/hip_runtime_api.h"  // the kernel-language keywords of launch.hpp's headers, as launch.cpp has them
#include "fp8gemm/wire.hpp"
#include "launch.hpp"

extern "C" void gfx942_emu_set_last_error(const char* text);

extern "C" uint32_t fp8gemm_gfx942_emu_protocol_version() { return fp8gemm::kProtocolVersion; }

extern "C" int64_t fp8gemm_gfx942_emu_args_size(int entry) {  // 0 launch, 1 quantize, 2 grouped_launch, 3 moe_step
  switch (entry) {
    case 0: return sizeof(fp8gemm::Wire<fp8gemm::LaunchArgs>);
    case 1: return sizeof(fp8gemm::Wire<fp8gemm::QuantizeArgs>);
    case 2: return sizeof(fp8gemm::Wire<fp8gemm::GroupedArgs>);
    case 3: return sizeof(fp8gemm::Wire<fp8gemm::MoeArgs>);
    default: return -1;
  }
}

extern "C" int fp8gemm_gfx942_emu_launch(uintptr_t args) {
  try {
    fp8gemm_gfx942::launch(fp8gemm::read_wire<fp8gemm::LaunchArgs>(args, "launch"));
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

extern "C" int fp8gemm_gfx942_emu_quantize(uintptr_t args) {
  try {
    fp8gemm_gfx942::quantize(fp8gemm::read_wire<fp8gemm::QuantizeArgs>(args, "quantize"));
    return 0;
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return 1;
  }
}

extern "C" int fp8gemm_gfx942_emu_grouped_launch(uintptr_t args) {
  try {
    fp8gemm_gfx942::grouped_launch(fp8gemm::read_wire<fp8gemm::GroupedArgs>(args, "grouped_launch"));
    return 0;
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return 1;
  }
}

extern "C" int64_t fp8gemm_gfx942_emu_grouped_workspace_bytes(int layout, int64_t m, int64_t n, int64_t k,
                                                              int64_t groups) {
  try {
    return fp8gemm_gfx942::grouped_workspace_bytes(layout, m, n, k, groups);
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return -1;
  }
}

extern "C" int fp8gemm_gfx942_emu_moe_step(uintptr_t args) {
  try {
    fp8gemm_gfx942::moe_step(fp8gemm::read_wire<fp8gemm::MoeArgs>(args, "moe_step"));
    return 0;
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return 1;
  }
}

extern "C" int64_t fp8gemm_gfx942_emu_moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  try {
    return fp8gemm_gfx942::moe_workspace_bytes(tokens, top_k, experts);
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return -1;
  }
}
