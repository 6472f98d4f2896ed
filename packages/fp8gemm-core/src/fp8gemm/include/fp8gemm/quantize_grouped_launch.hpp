// The host side of the grouped transposing quantizer (fp8gemm/quantize_grouped_tiles.cuh) that every arch's launcher
// shares: what it refuses before a launch.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

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
}

}  // namespace fp8gemm
