// The Python module every arch package exposes to the core (pybind11, no libtorch):
//   launch(args), workspace_bytes(m, n, k), build_info() -> dict, protocol_version(), args_sizes() -> dict, and
//   optionally quantize(args) and linear(args) with linear_workspace_bytes(m, n, k, in_kind), grouped_launch(args)
//   with grouped_workspace_bytes(layout, m, n, k, groups), moe_route(args), moe_activation(args) and
//   moe_combine(args) with moe_workspace_bytes(tokens, top_k, experts), a_scale_ld_multiple(), and wgrad_launch(args)
//   with wgrad_workspace_bytes(m, n, k) and wgrad_b_scale_ld_multiple(), quantize_transposed(args),
//   quantize_grouped_transposed(args) and kgrouped_wgrad_launch(args). Each `args` is
//   the address of a Wire<...Args> (fp8gemm/backend.hpp) that the core packed through its mirror (fp8gemm/protocol.py).
// An arch package's binding is then one line per entry:
//   PYBIND11_MODULE(_C, m) { fp8gemm::define_backend_module(m, &my::launch, &my::workspace_bytes, my::build_info); }
// or, for an arch with every entry of fp8gemm/arch_entry.hpp, one line in all (fp8gemm/arch_module.hpp).
#pragma once
#include <pybind11/pybind11.h>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/grouped_launch.hpp"
#include "fp8gemm/linear_steps.hpp"
#include "fp8gemm/native_entries.hpp"
#include "fp8gemm/wire.hpp"

namespace fp8gemm {

template <class Launch, class WorkspaceBytes, class BuildInfo>
void define_backend_module(pybind11::module_& m, Launch launch, WorkspaceBytes workspace_bytes, BuildInfo build_info) {
  m.doc() = "fp8gemm backend kernels; see fp8gemm.protocol for the launch contract";
  m.def("protocol_version", [] { return kProtocolVersion; }, "The backend protocol this build speaks");
  m.def(
      "args_sizes",
      [] {
        pybind11::dict sizes;
        sizes["launch"] = sizeof(Wire<LaunchArgs>);
        sizes["quantize"] = sizeof(Wire<QuantizeArgs>);
        sizes["linear"] = sizeof(Wire<LinearArgs>);
        sizes["grouped_launch"] = sizeof(Wire<GroupedArgs>);
        sizes["moe_route"] = sizeof(Wire<MoeRouteArgs>);
        sizes["moe_activation"] = sizeof(Wire<MoeActivationArgs>);
        sizes["moe_combine"] = sizeof(Wire<MoeCombineArgs>);
        sizes["wgrad_launch"] = sizeof(Wire<WgradArgs>);
        sizes["quantize_transposed"] = sizeof(Wire<QuantizeTransposedArgs>);
        sizes["quantize_grouped_transposed"] = sizeof(Wire<QuantizeGroupedTransposedArgs>);
        sizes["kgrouped_wgrad_launch"] = sizeof(Wire<KGroupedWgradArgs>);
        return sizes;
      },
      "Bytes of each entry's argument struct, header included (the core compares them with its mirrors)");
  m.def(
      "launch", [launch](uintptr_t args) { launch(read_wire<LaunchArgs>(args, "launch")); },
      "Enqueue one GEMM: `args` is the address of a packed fp8gemm.protocol.LAUNCH_ARGS");
  m.def("workspace_bytes", workspace_bytes, "Scratch bytes launch() needs for this shape on the current device");
  m.def("build_info", build_info, "Compiler, toolkit, arch flags and kernel of this build");
}

// The optional activation-quantization entry (fp8gemm.protocol.QuantizeFn).
template <class Quantize>
void define_quantize_entry(pybind11::module_& m, Quantize quantize) {
  m.def(
      "quantize", [quantize](uintptr_t args) { quantize(read_wire<QuantizeArgs>(args, "quantize")); },
      "Enqueue one activation quantization: `args` is the address of a packed fp8gemm.protocol.QUANTIZE_ARGS");
}

// The optional Linear-layer entry (fp8gemm.protocol.LinearFn): quantization and GEMM in one call.
template <class Linear, class WorkspaceBytes>
void define_linear_entry(pybind11::module_& m, Linear linear, WorkspaceBytes workspace_bytes) {
  m.def(
      "linear", [linear](uintptr_t args) { linear(read_wire<LinearArgs>(args, "linear")); },
      "Enqueue one Linear layer (activation quantization + GEMM): `args` is the address of a packed "
      "fp8gemm.protocol.LINEAR_ARGS");
  m.def("linear_workspace_bytes", workspace_bytes, "Scratch bytes linear() needs for (m, n, k, in_kind) on the current device");
}

// The optional grouped-GEMM entry (fp8gemm.protocol.GroupedFn), and its workspace (none unless given).
template <class Grouped, class WorkspaceBytes>
void define_grouped_entry(pybind11::module_& m, Grouped grouped, WorkspaceBytes workspace_bytes) {
  m.def(
      "grouped_launch", [grouped](uintptr_t args) { grouped(read_wire<GroupedArgs>(args, "grouped_launch")); },
      "Enqueue one grouped GEMM: `args` is the address of a packed fp8gemm.protocol.GROUPED_ARGS");
  m.def("grouped_workspace_bytes", workspace_bytes,
        "Scratch bytes grouped_launch() needs for (layout, m, n, k, groups) on the current device");
}

template <class Grouped>
void define_grouped_entry(pybind11::module_& m, Grouped grouped) {
  define_grouped_entry(m, grouped, &no_grouped_workspace);
}

// The optional mixture-of-experts step entries (each a fp8gemm.protocol.MoeStepFn;
// fp8gemm/moe_steps.cuh): one per step kernel, each reading its own struct.
template <class Route, class Activation, class Combine, class WorkspaceBytes>
void define_moe_entry(pybind11::module_& m, Route route, Activation activation, Combine combine,
                      WorkspaceBytes workspace_bytes) {
  m.def(
      "moe_route", [route](uintptr_t args) { route(read_wire<MoeRouteArgs>(args, "moe_route")); },
      "Enqueue fused_experts' route + quantize-scatter: `args` is the address of a packed "
      "fp8gemm.protocol.MOE_ROUTE_ARGS");
  m.def(
      "moe_activation",
      [activation](uintptr_t args) { activation(read_wire<MoeActivationArgs>(args, "moe_activation")); },
      "Enqueue fused_experts' SiLU-and-mul + quantize: `args` is the address of a packed "
      "fp8gemm.protocol.MOE_ACTIVATION_ARGS");
  m.def(
      "moe_combine", [combine](uintptr_t args) { combine(read_wire<MoeCombineArgs>(args, "moe_combine")); },
      "Enqueue fused_experts' combine: `args` is the address of a packed fp8gemm.protocol.MOE_COMBINE_ARGS");
  m.def("moe_workspace_bytes", workspace_bytes, "Scratch bytes moe_route() needs for (tokens, top_k, experts)");
}

// The optional weight-gradient entry (fp8gemm.protocol.WgradFn, fp8gemm/training_entries.hpp): wgrad_launch(args),
// wgrad_workspace_bytes(m, n, k), and wgrad_b_scale_ld_multiple(), the leading-dimension multiple (elements) of the B
// scales it reads (its backend.py states their order in the Backend's wgrad_b_scale_layout).
template <class Wgrad, class WorkspaceBytes>
void define_wgrad_entry(pybind11::module_& m, Wgrad wgrad, WorkspaceBytes workspace_bytes, int b_scale_ld_multiple) {
  m.def(
      "wgrad_launch", [wgrad](uintptr_t args) { wgrad(read_wire<WgradArgs>(args, "wgrad_launch")); },
      "Enqueue one weight-gradient GEMM (1 x 128 scales along K on both operands, fp32 out, optionally added into "
      "out): `args` is the address of a packed fp8gemm.protocol.WGRAD_ARGS");
  m.def("wgrad_workspace_bytes", workspace_bytes, "Scratch bytes wgrad_launch() needs for (m, n, k) on the current device");
  m.def("wgrad_b_scale_ld_multiple", [b_scale_ld_multiple] { return b_scale_ld_multiple; },
        "Leading-dimension multiple of the B scales wgrad_launch() reads");
}

// The optional transposing quantizer (fp8gemm.protocol.QuantizeTransposedFn, fp8gemm/training_entries.hpp).
template <class QuantizeTransposed>
void define_quantize_transposed_entry(pybind11::module_& m, QuantizeTransposed quantize_transposed) {
  m.def(
      "quantize_transposed",
      [quantize_transposed](uintptr_t args) {
        quantize_transposed(read_wire<QuantizeTransposedArgs>(args, "quantize_transposed"));
      },
      "Enqueue one quantization of an operand and its transpose (one read): `args` is the address of a packed "
      "fp8gemm.protocol.QUANTIZE_TRANSPOSED_ARGS");
}

// The optional k-grouped weight-gradient GEMM (fp8gemm.protocol.KGroupedWgradFn, fp8gemm/training_entries.hpp): every
// expert's weight gradient in one launch, on the layout of the grouped transposing quantizer.
template <class KGroupedWgrad>
void define_kgrouped_wgrad_entry(pybind11::module_& m, KGroupedWgrad kgrouped_wgrad) {
  m.def(
      "kgrouped_wgrad_launch",
      [kgrouped_wgrad](uintptr_t args) { kgrouped_wgrad(read_wire<KGroupedWgradArgs>(args, "kgrouped_wgrad_launch")); },
      "Enqueue every expert's weight-gradient GEMM over its own K blocks (one launch): `args` is the address of a "
      "packed fp8gemm.protocol.KGROUPED_WGRAD_ARGS");
  m.def("kgrouped_max_experts", [] { return kKGroupedMaxExperts; }, "The most experts kgrouped_wgrad_launch() takes");
}

// The optional grouped transposing quantizer (fp8gemm.protocol.QuantizeGroupedTransposedFn,
// fp8gemm/training_entries.hpp): x and its per-expert transpose for a mixture of experts.
template <class QuantizeGroupedTransposed>
void define_quantize_grouped_transposed_entry(pybind11::module_& m, QuantizeGroupedTransposed quantize_grouped) {
  m.def(
      "quantize_grouped_transposed",
      [quantize_grouped](uintptr_t args) {
        quantize_grouped(read_wire<QuantizeGroupedTransposedArgs>(args, "quantize_grouped_transposed"));
      },
      "Enqueue one quantization of rows sorted by expert and of their per-expert transpose (one read): `args` is the "
      "address of a packed fp8gemm.protocol.QUANTIZE_GROUPED_TRANSPOSED_ARGS");
}

// The optional training entries for the native ops library (fp8gemm/native_entries.hpp) as
// native_training_entries(): the address of `entries`, a static of the arch's module, null pointers for what it lacks.
inline void define_native_training_entries(pybind11::module_& m, const NativeTrainingEntries* entries) {
  m.def("native_training_entries", [entries] { return reinterpret_cast<uintptr_t>(entries); },
        "The address of this module's training entries for its native ops library (fp8gemm/native_entries.hpp)");
}

// The leading-dimension multiple (elements) of the arch's MN-major A scales, as a_scale_ld_multiple(): its
// backend.py reads it into the Backend's a_scale_layout, so the build states it once.
inline void define_a_scale_ld_multiple(pybind11::module_& m, int multiple) {
  m.def("a_scale_ld_multiple", [multiple] { return multiple; }, "Leading-dimension multiple of the MN-major A scales");
}

// The Linear-layer entry of an arch whose layer is its quantize, then its launch (fp8gemm/linear_steps.hpp): one
// call from Python, two launches. scale_ld_multiple: the leading-dimension multiple of its MN-major A scales.
template <class Quantize, class Launch, class WorkspaceBytes>
void define_two_step_linear_entry(pybind11::module_& m, Quantize quantize, Launch launch, WorkspaceBytes workspace_bytes,
                                  int scale_ld_multiple) {
  auto layout = [=](int64_t rows, int64_t n, int64_t k) {
    return linear_workspace(rows, k, workspace_bytes(rows, n, k), scale_ld_multiple);
  };
  define_linear_entry(
      m, [=](const LinearArgs& a) { linear_in_two_steps(a, layout(a.m, a.n, a.k), quantize, launch); },
      [=](int64_t rows, int64_t n, int64_t k, int) { return layout(rows, n, k).bytes; });
}

}  // namespace fp8gemm
