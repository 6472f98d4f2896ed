// The host side of the mixture-of-experts steps (fp8gemm/moe_steps.cuh) every arch shares: each entry's argument
// checks and its launch's grid. Host code only.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/moe_steps.cuh"

namespace fp8gemm {

// Blocks of one step's launch (kMoeThreads threads each). Route: one per chunk of tokens (count_blocks: the count
// launch before it, 0 for a single chunk). Activation: x = K blocks of I, y = groups of kMoeGroups rows. Combine: one
// per (token, kMoeThreads * moe_combine_cols(tokens) columns). An x or y of 0: nothing to launch.
struct MoeGrid {
  int64_t count_blocks, x, y;
};

// The checks below refuse what the kernels do not take, with std::invalid_argument (a ValueError in Python), in the
// entry's name: "<package>: moe_route: ...".
inline std::string moe_who(const char* package, const char* entry) { return std::string(package) + ": " + entry + ": "; }

inline void check_moe_experts(int64_t experts, const std::string& who) {
  if (experts < 1 || experts > kMoeMaxExperts)
    throw std::invalid_argument(who + "E = " + std::to_string(experts) + " experts (w13.shape[0]); the fused steps take 1 to " +
                                std::to_string(kMoeMaxExperts));
}

inline void check_moe_slots(int64_t tokens, int64_t top_k, const std::string& who) {
  if (top_k < 1 || top_k > kMoeChunkSlots)
    throw std::invalid_argument(who + "top_k = " + std::to_string(top_k) + "; the fused steps take 1 to " +
                                std::to_string(kMoeChunkSlots));
  if (tokens < 0 || tokens * top_k > 0x7fffffff) throw std::invalid_argument(who + "more than 2^31 - 1 rows");
}

inline void check_moe_rows(int64_t rows, const std::string& who) {
  if (rows < 0 || rows > 0x7fffffff) throw std::invalid_argument(who + "more than 2^31 - 1 rows");
}

inline void check_moe_block_multiple(int64_t size, const char* what, const std::string& who) {
  if (size % kQuantBlock) throw std::invalid_argument(who + "the " + what + " size must be a multiple of 128");
}

inline bool is_float_kind(int kind) { return kind == kInBF16 || kind == kInFP16 || kind == kInFP32; }

inline MoeGrid moe_route_grid(const MoeRouteArgs& a, const char* package) {
  const std::string who = moe_who(package, "moe_route");
  check_moe_experts(a.experts, who);
  check_moe_slots(a.tokens, a.top_k, who);
  check_moe_block_multiple(a.hidden, "hidden", who);
  if (!is_float_kind(a.in_kind) || (a.id_kind != 0 && a.id_kind != 1)) throw std::invalid_argument(who + "unknown x or id kind");
  const int64_t count_blocks = moe_route_workspace_bytes(a.tokens, a.top_k, a.experts) ? moe_chunks(a.tokens, a.top_k) : 0;
  if (count_blocks && !a.workspace) throw std::invalid_argument(who + "the route step needs its workspace");
  return {count_blocks, moe_chunks(a.tokens, a.top_k), 1};
}

inline MoeGrid moe_activation_grid(const MoeActivationArgs& a, const char* package) {
  const std::string who = moe_who(package, "moe_activation");
  check_moe_experts(a.experts, who);
  check_moe_rows(a.rows, who);
  check_moe_block_multiple(a.inter, "intermediate", who);
  return {0, a.inter / kQuantBlock, (a.rows + kMoeGroups - 1) / kMoeGroups};
}

inline MoeGrid moe_combine_grid(const MoeCombineArgs& a, const char* package) {
  const std::string who = moe_who(package, "moe_combine");
  check_moe_slots(a.tokens, a.top_k, who);
  check_moe_rows(a.rows, who);
  check_moe_block_multiple(a.hidden, "hidden", who);
  if (!is_float_kind(a.out_kind) || !is_float_kind(a.weight_kind) || (a.y_kind != kOutBF16 && a.y_kind != kOutFP32))
    throw std::invalid_argument(who + "unknown out, weight or y kind");
  // A slot that selects nothing reads y's row 0 (moe_combine_kinds), and row offsets are 32-bit products.
  if (a.tokens > 0 && (a.rows < 1 || a.ldy < a.hidden || a.ldy > (int64_t(1) << 29)))
    throw std::invalid_argument(who + "the combine's y needs at least one row and a row stride of hidden to 2^29");
  return {0, a.tokens * moe_combine_blocks(a.tokens, a.hidden), 1};
}

inline int64_t moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return top_k >= 1 && tokens >= 0 ? moe_route_workspace_bytes(tokens, top_k, experts) : 0;
}

}  // namespace fp8gemm
