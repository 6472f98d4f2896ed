// fp8gemm's Torch binding for kernel-builder (huggingface/kernels@8ac69fc542a4306eade0759ef7c45b4f2ae57df0, the
// torch-ext convention of examples/kernels/relu/torch-ext/torch_binding.cpp): one op library per backend, its ops in
// the extension's generated namespace (torch.ops.<TORCH_EXTENSION_NAME>, the `ops` of the generated _ops.py).
//
// The namespace's own ops are here; each arch package compiled into the library adds `<arch>__<entry>` ops for the
// entries of its unchanged csrc/module.cpp (launch, workspace_bytes, build_info, protocol_version, args_sizes,
// quantize, linear, grouped_launch, ... whatever it defines), through the pybind11 stand-in
// hub_shim/pybind11/pybind11.h: the launch-like entries take the int64 address of their wire struct
// (fp8gemm/backend.hpp). The vendored core reaches them through fp8gemm/_bundled/<arch>/_C.py (ci/hub/_C.py), which
// exposes the names of the pybind11 _C. A CPU build holds no arch: arches() is empty and the core runs its reference.
#include <torch/library.h>

#include "fp8gemm/backend.hpp"
#include "registration.h"
#include "torch_binding.h"

namespace fp8gemm_hub {

std::vector<std::string>& compiled_arches() {
  static std::vector<std::string> arches;
  return arches;
}

}  // namespace fp8gemm_hub

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // JSON list of the arch modules in this library, e.g. ["fp8gemm_cuda_sm90a", "fp8gemm_cuda_sm120"].
  ops.def("arches() -> str", []() -> std::string {
    std::string out = "[";
    for (const auto& arch : fp8gemm_hub::compiled_arches()) out += (out.size() > 1 ? ", \"" : "\"") + arch + "\"";
    return out + "]";
  });
  ops.def("protocol_version() -> int", []() -> int64_t { return fp8gemm::kProtocolVersion; });
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
