// The host side of the mixture-of-experts steps (fp8gemm/moe_steps.cuh) every arch shares: the argument checks
// and each launch's grid. Host code only.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"
#include "fp8gemm/moe_steps.cuh"

namespace fp8gemm {

// Blocks of one step's launch (kMoeThreads threads each). Route: one per chunk of tokens (count_blocks: the
// count launch before it, 0 for a single chunk). Activation: x = K blocks of I, y = groups of kMoeGroups rows.
// Combine: one per (token, kMoeThreads * moe_combine_cols(tokens) columns).
struct MoeGrid {
  int64_t count_blocks, x, y;
};

// Refuses what the kernels do not take, with std::invalid_argument (a ValueError in Python).
inline MoeGrid moe_grid(const MoeArgs& a, const char* package) {
  const std::string who = std::string(package) + ": moe_step: ";
  if (a.experts < 1 || a.experts > kMoeMaxExperts)
    throw std::invalid_argument(who + "E = " + std::to_string(a.experts) + " experts (w13.shape[0]); the fused steps take 1 to " +
                                std::to_string(kMoeMaxExperts));
  if (a.top_k < 1 || a.top_k > kMoeChunkSlots)
    throw std::invalid_argument(who + "top_k = " + std::to_string(a.top_k) + "; the fused steps take 1 to " +
                                std::to_string(kMoeChunkSlots));
  if (a.tokens < 0 || a.tokens * a.top_k > 0x7fffffff || a.rows < 0 || a.rows > 0x7fffffff)
    throw std::invalid_argument(who + "more than 2^31 - 1 rows");
  if (a.hidden % kQuantBlock || a.inter % kQuantBlock)
    throw std::invalid_argument(who + "hidden and intermediate sizes must be multiples of 128");
  const bool float_kind = a.in_kind == kInBF16 || a.in_kind == kInFP16 || a.in_kind == kInFP32;
  switch (a.step) {
    case kMoeRoute:
      if (!float_kind || (a.id_kind != 0 && a.id_kind != 1)) throw std::invalid_argument(who + "unknown x or id kind");
      return {moe_route_workspace_bytes(a.tokens, a.top_k, a.experts) ? moe_chunks(a.tokens, a.top_k) : 0,
              moe_chunks(a.tokens, a.top_k), 1};
    case kMoeActivation:
      return {0, a.inter / kQuantBlock, (a.rows + kMoeGroups - 1) / kMoeGroups};
    case kMoeCombine: {
      const bool weight_kind = a.weight_kind == kInBF16 || a.weight_kind == kInFP16 || a.weight_kind == kInFP32;
      if (!float_kind || !weight_kind || (a.y_kind != kOutBF16 && a.y_kind != kOutFP32))
        throw std::invalid_argument(who + "unknown out, weight or y kind");
      // A slot that selects nothing reads y's row 0 (moe_combine_kinds), and row offsets are 32-bit products.
      if (a.tokens > 0 && (a.rows < 1 || a.ldy < a.hidden || a.ldy > (int64_t(1) << 29)))
        throw std::invalid_argument(who + "the combine's y needs at least one row and a row stride of hidden to 2^29");
      return {0, a.tokens * moe_combine_blocks(a.tokens, a.hidden), 1};
    }
    default:
      throw std::invalid_argument(who + "unknown step " + std::to_string(a.step));
  }
}

inline int64_t moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return top_k >= 1 && tokens >= 0 ? moe_route_workspace_bytes(tokens, top_k, experts) : 0;
}

}  // namespace fp8gemm
