// The protocol module of an arch package that defines every entry fp8gemm/arch_entry.hpp declares, in one call from
// its module.cpp, after its own header has named FP8GEMM_ARCH_NAMESPACE, included arch_entry.hpp and stated
// kAScaleLdMultiple in that namespace (the leading-dimension multiple, in elements, of its MN-major A scales):
//   PYBIND11_MODULE(_C, m) { fp8gemm::define_arch_module(m, &build_info); }
// The module's a_scale_ld_multiple() gives that multiple to the arch's backend.py (its Backend's a_scale_layout), and
// the two-step linear entry lays out its own A scales by it. An arch with fewer entries calls
// fp8gemm/backend_module.hpp's define_* functions itself.
#pragma once
#include "fp8gemm/arch_entry.hpp"
#include "fp8gemm/backend_module.hpp"
#include "fp8gemm/native_entries.hpp"

namespace fp8gemm {
// Internal linkage: each arch's module binds its own namespace's entries, and one library may link several arches.
namespace {

template <class BuildInfo>
void define_arch_module(pybind11::module_& m, BuildInfo build_info) {
  namespace arch = ::FP8GEMM_ARCH_NAMESPACE;
  define_backend_module(m, &arch::launch, &arch::workspace_bytes, build_info);
  define_a_scale_ld_multiple(m, arch::kAScaleLdMultiple);
  define_quantize_entry(m, &arch::quantize);
  define_two_step_linear_entry(m, &arch::quantize, &arch::launch, &arch::workspace_bytes, arch::kAScaleLdMultiple);
  define_grouped_entry(m, &arch::grouped_launch);
  define_moe_entry(m, &arch::moe_route, &arch::moe_activation, &arch::moe_combine, &arch::moe_workspace_bytes);
  m.def("native_entries", [] {
    static const NativeEntries entries{kNativeEntriesVersion, sizeof(NativeEntries), &arch::launch,
                                       &arch::workspace_bytes, &arch::quantize, arch::kAScaleLdMultiple,
                                       &arch::grouped_launch, &no_grouped_workspace, &arch::moe_route,
                                       &arch::moe_activation, &arch::moe_combine, &arch::moe_workspace_bytes};
    return reinterpret_cast<uintptr_t>(&entries);
  }, "The address of this module's entries for its native ops library (fp8gemm/native_entries.hpp)");
}

}  // namespace
}  // namespace fp8gemm
