// Host side: device query, plan (heuristics.hpp), launches on the caller's stream. Plain C++ against
// the HIP runtime API, compiled by the host compiler.
#include <hip/hip_runtime_api.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/grouped_launch.hpp"
#include "fp8gemm/moe_launch.hpp"
#include "fp8gemm/quantize_grouped_launch.hpp"
#include "launch.hpp"

namespace fp8gemm_gfx942 {
namespace {

constexpr int kMaxDevices = 64;
constexpr const char* kPackage = "fp8gemm-rocm-gfx942";

void check(int err, const char* what) {
  if (err != hipSuccess)
    throw std::runtime_error(std::string(kPackage) + ": " + what + ": " + hipGetErrorString(static_cast<hipError_t>(err)));
}

int current_device() {
  int dev = 0;
  check(hipGetDevice(&dev), "hipGetDevice");
  if (dev < 0 || dev >= kMaxDevices) throw std::runtime_error(std::string(kPackage) + ": device index out of range");
  return dev;
}

}  // namespace

int cu_count() {
  static int cached[kMaxDevices] = {};
  const int dev = current_device();
  if (!cached[dev]) check(hipDeviceGetAttribute(&cached[dev], hipDeviceAttributeMultiprocessorCount, dev), "CU count");
  return cached[dev];
}

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k) { return geometry(m, n, k, cu_count()).workspace_bytes; }

void launch(const fp8gemm::LaunchArgs& args) {
  const Geometry g = geometry(args.m, args.n, args.k, cu_count());
  if (g.grid_z > 1 && !args.workspace) throw std::runtime_error("fp8gemm-rocm-gfx942: split-K plan needs the workspace");
  const Params p = fp8gemm::gemm_params(args, g.grid_z, g.kb_per_split);
  void* stream = reinterpret_cast<void*>(args.stream);
  check(enqueue_gemm(p, g, stream), "GEMM kernel launch");
  if (g.grid_z > 1) {
    const int64_t blocks = (args.m * args.n + kThreads - 1) / kThreads;
    check(enqueue_reduce(p, g.grid_z, static_cast<int>(blocks < 8 * cu_count() ? blocks : 8 * cu_count()), stream),
          "split-K reduction launch");
  }
}

int64_t wgrad_workspace_bytes(int64_t, int64_t, int64_t) { return 0; }  // never split along K

namespace {

// The checks and the parameter block both weight-gradient entries share (fp8gemm::WgradArgs or
// fp8gemm::KGroupedWgradArgs: the same operand fields).
template <class Args>
Params wgrad_params(const Args& args, const char* entry) {
  const std::string who = std::string(kPackage) + ": " + entry + ": ";
  if (const char* why = fp8gemm::wgrad_args_refusal(args)) throw std::invalid_argument(who + why);
  Params p{};
  fp8gemm::set_operands(p, args);  // b_scale: per row of b, MN-major
  p.kb_per_split = p.k / kBlockK;
  return p;
}

}  // namespace

void wgrad_launch(const fp8gemm::WgradArgs& args) {
  const Params p = wgrad_params(args, "wgrad_launch");
  check(enqueue_wgrad(p, wgrad_geometry(args.m, args.n, args.k), args.accumulate != 0,
                      reinterpret_cast<void*>(args.stream)),
        "weight-gradient kernel launch");
}

void kgrouped_wgrad_launch(const fp8gemm::KGroupedWgradArgs& args) {
  if (args.experts < 1 || args.experts > fp8gemm::kKGroupedMaxExperts || args.k < kBlockK * (args.experts + 1))
    throw std::invalid_argument(std::string(kPackage) + ": kgrouped_wgrad_launch: 1 <= experts <= " +
                                std::to_string(fp8gemm::kKGroupedMaxExperts) + " and k >= 128 * (experts + 1) (the "
                                "per-expert aligned layout) are required");
  const Params p = wgrad_params(args, "kgrouped_wgrad_launch");
  const KGroupedParams kg{reinterpret_cast<const int32_t*>(args.offs), static_cast<int>(args.experts), args.out_es};
  check(enqueue_kgrouped_wgrad(p, kg, wgrad_geometry(args.m, args.n, args.k), args.accumulate != 0,
                               reinterpret_cast<void*>(args.stream)),
        "k-grouped weight-gradient kernel launch");
}

void grouped_launch(const fp8gemm::GroupedArgs& args) {
  if (!fp8gemm::grouped_launch_has_work(args, kPackage, /*row_ids=*/true)) return;
  const GroupedGeometry g = grouped_geometry(args.layout, args.m, args.n, args.groups, args.expected_m);
  fp8gemm::check_grouped_tiles(g.grid_y, g.grid_x, 0, kPackage);
  check(enqueue_grouped(fp8gemm::grouped_params(args, g.tiles_per_group, g.grid_y), g, reinterpret_cast<void*>(args.stream)), "grouped GEMM kernel launch");
}

void quantize(const fp8gemm::QuantizeArgs& args) {
  check(enqueue_quantize(fp8gemm::quantize_params(args), args.in_kind, reinterpret_cast<void*>(args.stream)),
        "quantize kernel launch");
}

void quantize_transposed(const fp8gemm::QuantizeTransposedArgs& args) {
  const int64_t row_blocks = (args.m_t + fp8gemm::kQuantBlock - 1) / fp8gemm::kQuantBlock;
  const int64_t k_blocks = args.k / fp8gemm::kQuantBlock;
  if (args.m < 1 || args.m_t < args.m || args.m_t % 16 || args.k < fp8gemm::kQuantBlock || args.k % fp8gemm::kQuantBlock ||
      (args.blocks != 0 && args.blocks != 1) || (args.blocks && args.m_t != args.m) || args.in_kind < fp8gemm::kInBF16 ||
      args.in_kind > fp8gemm::kInFP32 || !fp8gemm::q_t_group_fits(args))
    throw std::invalid_argument(std::string(kPackage) + ": quantize_transposed: m >= 1, m_t >= m a multiple of 16 (m_t = "
                                "m for weights), k a positive multiple of 128, blocks 0 or 1, a known input kind and "
                                "q_t_group 0 or a multiple of 128 dividing m_t are required");
  // grid x counts work-items in 32 bits (the dispatch packet's grid_size_x), grid y at most 65535 workgroups
  if (row_blocks * fp8gemm::kQuantThreads > UINT32_MAX || k_blocks > 65535)
    throw std::invalid_argument(std::string(kPackage) + ": quantize_transposed: too many rows or K blocks for one launch");
  check(enqueue_quantize_transposed(fp8gemm::quantize_transposed_params(args), args.in_kind, row_blocks, k_blocks,
                                    reinterpret_cast<void*>(args.stream)),
        "quantize_transposed kernel launch");
}

void quantize_grouped_transposed(const fp8gemm::QuantizeGroupedTransposedArgs& args) {
  fp8gemm::check_grouped_quantize_args(args, kPackage);
  const int64_t tiles = fp8gemm::grouped_tile_count(args.m, args.columns), k_blocks = args.k / fp8gemm::kQuantBlock;
  // grid x counts work-items in 32 bits (the dispatch packet's grid_size_x), grid y at most 65535 workgroups
  if (tiles * fp8gemm::kQuantThreads > UINT32_MAX || k_blocks > 65535)
    throw std::invalid_argument(std::string(kPackage) +
                                ": quantize_grouped_transposed: too many rows or K blocks for one launch");
  void* stream = reinterpret_cast<void*>(args.stream);
  if (args.source == fp8gemm::kSourceRows) {
    check(enqueue_quantize_grouped_transposed(fp8gemm::quantize_grouped_params(args), args.in_kind, tiles, k_blocks,
                                              stream),
          "quantize_grouped_transposed kernel launch");
    return;
  }
  const int err = enqueue_quantize_grouped_source(fp8gemm::quantize_grouped_params(args), args.source, args.in_kind,
                                                  args.gate_up_kind, tiles, k_blocks, stream);
  // a source the core's check passes but this package has no kernel for must not run as plain rows
  if (err == kNoSourceKernel)
    throw std::invalid_argument(std::string(kPackage) + ": quantize_grouped_transposed: no kernel for source " +
                                std::to_string(args.source) + " with input kind " + std::to_string(args.in_kind) +
                                " and gate_up kind " + std::to_string(args.gate_up_kind));
  check(err, "quantize_grouped_transposed source kernel launch");
}

int64_t moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return fp8gemm::moe_workspace_bytes(tokens, top_k, experts);
}

namespace {

// False: an empty grid, nothing to launch.
bool moe_grid_fits(const fp8gemm::MoeGrid& g, const char* entry) {
  if (g.x == 0 || g.y == 0) return false;
  if (g.x > INT_MAX || g.y > INT_MAX) throw std::invalid_argument(fp8gemm::moe_who(kPackage, entry) + "too many rows for one launch");
  return true;
}

}  // namespace

void moe_route(const fp8gemm::MoeRouteArgs& args) {
  const fp8gemm::MoeGrid g = fp8gemm::moe_route_grid(args, kPackage);
  if (moe_grid_fits(g, "moe_route"))
    check(enqueue_moe_route(fp8gemm::moe_route_params(args), g.count_blocks, g.x, reinterpret_cast<void*>(args.stream)),
          "moe_route kernel launch");
}

void moe_activation(const fp8gemm::MoeActivationArgs& args) {
  const fp8gemm::MoeGrid g = fp8gemm::moe_activation_grid(args, kPackage);
  if (moe_grid_fits(g, "moe_activation"))
    check(enqueue_moe_activation(fp8gemm::moe_activation_params(args), g.x, g.y, reinterpret_cast<void*>(args.stream)),
          "moe_activation kernel launch");
}

void moe_combine(const fp8gemm::MoeCombineArgs& args) {
  const fp8gemm::MoeGrid g = fp8gemm::moe_combine_grid(args, kPackage);
  if (moe_grid_fits(g, "moe_combine"))
    check(enqueue_moe_combine(fp8gemm::moe_combine_params(args), g.x, reinterpret_cast<void*>(args.stream)),
          "moe_combine kernel launch");
}

}  // namespace fp8gemm_gfx942
