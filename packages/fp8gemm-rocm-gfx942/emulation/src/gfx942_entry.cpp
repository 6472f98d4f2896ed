// C entry points of the emulated gfx942 backend: the package's own launch(), workspace_bytes(), quantize(),
// grouped_launch(), moe_route(), moe_activation(), moe_combine(), moe_workspace_bytes(), wgrad_launch(),
// wgrad_workspace_bytes(), kgrouped_wgrad_launch(), quantize_transposed() and quantize_grouped_transposed()
// (csrc/launch.cpp), and the module's a_scale_ld_multiple(), wgrad_b_scale_ld_multiple(), kgrouped_max_experts() and
// grouped_workspace_bytes(), behind the protocol's argument structs (read and
// checked as the package's module reads them), with C++ exceptions turned into an error code and the emulator's last
// error.
#include <cstdint>
#include <exception>

#include "hip/hip_runtime_api.h"  // the kernel-language keywords of launch.hpp's headers, as launch.cpp has them
#include "fp8gemm/grouped_launch.hpp"
#include "fp8gemm/wire.hpp"
#include "launch.hpp"

extern "C" void gfx942_emu_set_last_error(const char* text);

namespace {

// `call()`, or `failed` with the exception's text as the emulator's last error.
template <class Call>
auto guarded(Call call, decltype(call()) failed) -> decltype(call()) {
  try {
    return call();
  } catch (const std::exception& exc) {
    gfx942_emu_set_last_error(exc.what());
    return failed;
  }
}

// One entry taking the address of a Wire<Args>: 0, or 1 with the emulator's last error.
template <class Args, class Entry>
int wire_entry(uintptr_t args, const char* name, Entry entry) {
  return guarded([&] { return entry(fp8gemm::read_wire<Args>(args, name)), 0; }, 1);
}

}  // namespace

extern "C" uint32_t fp8gemm_gfx942_emu_protocol_version() { return fp8gemm::kProtocolVersion; }

extern "C" int fp8gemm_gfx942_emu_a_scale_ld_multiple() { return fp8gemm_gfx942::kAScaleLdMultiple; }

extern "C" int fp8gemm_gfx942_emu_wgrad_b_scale_ld_multiple() { return fp8gemm_gfx942::kWgradBScaleLdMultiple; }

// 0 launch, 1 quantize, 2 grouped_launch, 3 moe_route, 4 moe_activation, 5 moe_combine, 6 wgrad_launch,
// 7 quantize_transposed, 8 quantize_grouped_transposed, 9 kgrouped_wgrad_launch
extern "C" int64_t fp8gemm_gfx942_emu_args_size(int entry) {
  switch (entry) {
    case 0: return sizeof(fp8gemm::Wire<fp8gemm::LaunchArgs>);
    case 1: return sizeof(fp8gemm::Wire<fp8gemm::QuantizeArgs>);
    case 2: return sizeof(fp8gemm::Wire<fp8gemm::GroupedArgs>);
    case 3: return sizeof(fp8gemm::Wire<fp8gemm::MoeRouteArgs>);
    case 4: return sizeof(fp8gemm::Wire<fp8gemm::MoeActivationArgs>);
    case 5: return sizeof(fp8gemm::Wire<fp8gemm::MoeCombineArgs>);
    case 6: return sizeof(fp8gemm::Wire<fp8gemm::WgradArgs>);
    case 7: return sizeof(fp8gemm::Wire<fp8gemm::QuantizeTransposedArgs>);
    case 8: return sizeof(fp8gemm::Wire<fp8gemm::QuantizeGroupedTransposedArgs>);
    case 9: return sizeof(fp8gemm::Wire<fp8gemm::KGroupedWgradArgs>);
    default: return -1;
  }
}

extern "C" int fp8gemm_gfx942_emu_launch(uintptr_t args) {
  return wire_entry<fp8gemm::LaunchArgs>(args, "launch", fp8gemm_gfx942::launch);
}

extern "C" int64_t fp8gemm_gfx942_emu_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return guarded([&] { return fp8gemm_gfx942::workspace_bytes(m, n, k); }, int64_t{-1});
}

extern "C" int fp8gemm_gfx942_emu_wgrad_launch(uintptr_t args) {
  return wire_entry<fp8gemm::WgradArgs>(args, "wgrad_launch", fp8gemm_gfx942::wgrad_launch);
}

extern "C" int fp8gemm_gfx942_emu_kgrouped_wgrad_launch(uintptr_t args) {
  return wire_entry<fp8gemm::KGroupedWgradArgs>(args, "kgrouped_wgrad_launch", fp8gemm_gfx942::kgrouped_wgrad_launch);
}

// As the module's define_kgrouped_wgrad_entry (fp8gemm/backend_module.hpp).
extern "C" int fp8gemm_gfx942_emu_kgrouped_max_experts() { return fp8gemm::kKGroupedMaxExperts; }

extern "C" int64_t fp8gemm_gfx942_emu_wgrad_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return guarded([&] { return fp8gemm_gfx942::wgrad_workspace_bytes(m, n, k); }, int64_t{-1});
}

extern "C" int fp8gemm_gfx942_emu_quantize(uintptr_t args) {
  return wire_entry<fp8gemm::QuantizeArgs>(args, "quantize", fp8gemm_gfx942::quantize);
}

extern "C" int fp8gemm_gfx942_emu_quantize_transposed(uintptr_t args) {
  return wire_entry<fp8gemm::QuantizeTransposedArgs>(args, "quantize_transposed", fp8gemm_gfx942::quantize_transposed);
}

extern "C" int fp8gemm_gfx942_emu_quantize_grouped_transposed(uintptr_t args) {
  return wire_entry<fp8gemm::QuantizeGroupedTransposedArgs>(args, "quantize_grouped_transposed",
                                                            fp8gemm_gfx942::quantize_grouped_transposed);
}

extern "C" int fp8gemm_gfx942_emu_grouped_launch(uintptr_t args) {
  return wire_entry<fp8gemm::GroupedArgs>(args, "grouped_launch", fp8gemm_gfx942::grouped_launch);
}

extern "C" int64_t fp8gemm_gfx942_emu_grouped_workspace_bytes(int layout, int64_t m, int64_t n, int64_t k,
                                                              int64_t groups) {
  return fp8gemm::no_grouped_workspace(layout, m, n, k, groups);  // as the module's grouped entry (module.cpp)
}

extern "C" int fp8gemm_gfx942_emu_moe_route(uintptr_t args) {
  return wire_entry<fp8gemm::MoeRouteArgs>(args, "moe_route", fp8gemm_gfx942::moe_route);
}

extern "C" int fp8gemm_gfx942_emu_moe_activation(uintptr_t args) {
  return wire_entry<fp8gemm::MoeActivationArgs>(args, "moe_activation", fp8gemm_gfx942::moe_activation);
}

extern "C" int fp8gemm_gfx942_emu_moe_combine(uintptr_t args) {
  return wire_entry<fp8gemm::MoeCombineArgs>(args, "moe_combine", fp8gemm_gfx942::moe_combine);
}

extern "C" int64_t fp8gemm_gfx942_emu_moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return guarded([&] { return fp8gemm_gfx942::moe_workspace_bytes(tokens, top_k, experts); }, int64_t{-1});
}
