// The host side of the grouped transposing quantizer (fp8gemm/quantize_grouped_tiles.cuh) that every arch's launcher
// shares: what it refuses before a launch.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// Throws std::invalid_argument, naming `package`, for a source its kernels do not take (RowSourceKind's rules).
inline void check_row_source(const QuantizeGroupedTransposedArgs& a, const char* package) {
  const std::string who = std::string(package) + ": quantize_grouped_transposed: ";
  switch (a.source) {
    case kSourceRows: return;
    case kSourceGather:
      if (!a.index || a.source_rows < 0 || a.ldx < a.k)
        throw std::invalid_argument(who + "the gather source needs index, source_rows >= 0 and x rows of k values");
      return;
    case kSourceSwiglu:
      if (a.in_kind != kInFP32 || a.ldx < 2 * a.k)
        throw std::invalid_argument(who + "the SwiGLU source reads fp32 h rows of 2k values");
      return;
    case kSourceSwigluBackward:
      if (a.in_kind != kInFP32 || !a.gate_up || a.k % 256 || a.gate_up_kind < kInBF16 || a.gate_up_kind > kInFP32 ||
          a.ldx < a.k / 2 || a.ld_gate_up < a.k)
        throw std::invalid_argument(who + "the SwiGLU backward source reads fp32 d [m, k/2] and h [m, k] of a known "
                                    "kind, k a multiple of 256");
      return;
    default: throw std::invalid_argument(who + "unknown source " + std::to_string(a.source));
  }
}

// Throws std::invalid_argument, naming `package`, for arguments outside QuantizeGroupedTransposedArgs' guarantees or
// a q_t of another width than the layout's 128 * (experts + m / 128 + 1) columns.
inline void check_grouped_quantize_args(const QuantizeGroupedTransposedArgs& a, const char* package) {
  const bool sizes = a.m >= 1 && a.k >= 128 && a.k % 128 == 0 && a.experts >= 1 && a.experts <= INT32_MAX;
  const bool kind = a.in_kind >= kInBF16 && a.in_kind <= kInFP32;
  if (!sizes || !kind)
    throw std::invalid_argument(std::string(package) + ": quantize_grouped_transposed: m >= 1, k a positive multiple "
                                "of 128, 1 <= experts < 2^31 and a known input kind are required");
  if (a.columns != 128 * (a.experts + a.m / 128 + 1))
    throw std::invalid_argument(std::string(package) + ": quantize_grouped_transposed: columns must be 128 * (experts "
                                "+ m / 128 + 1) = " + std::to_string(128 * (a.experts + a.m / 128 + 1)) + ", got " +
                                std::to_string(a.columns));
  check_row_source(a, package);
}

}  // namespace fp8gemm
