// The matrix instruction from AMD's documentation, independent of any kernel that uses it.
//
// Register layout of v_mfma_f32_32x32x16_fp8_fp8 (M = N = 32, K = 16, one block), as printed by
// AMD's Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_calculator,
// `matrix_calculator.py -a cdna3 -i v_mfma_f32_32x32x16_fp8_fp8 -{A,B,C,D} --matrix-layout`; the
// tables are kept in ../isa_layouts/) and described in the "AMD Instinct MI300 ISA Reference
// Guide", section 7 (Matrix Arithmetic Instructions):
//   A[i][k]: lane i + 32 * (k / 8), byte k % 8 of the 64-bit source (v0 bytes 0-3, v1 bytes 4-7)
//   B[k][j]: lane j + 32 * (k / 8), byte k % 8
//   C[i][j], D[i][j]: lane j + 32 * ((i / 4) % 2), register 4 * (i / 8) + i % 4
// Numerics: each FP8 x FP8 product is exact, the 16 products are summed exactly (float64 holds
// them: magnitudes 2^-20 .. 2^16) and added to the fp32 accumulator with one rounding.
#include "mfma.hpp"

#include <cmath>
#include <limits>

namespace gfx942_emu {

double decode_fp8_e4m3fnuz(uint8_t code) {
  if (code == 0x80) return std::numeric_limits<double>::quiet_NaN();
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, 1 - 8 - 3)  // subnormal: m / 8 * 2^(1 - bias)
                                         : std::ldexp(8 + mantissa, exponent - 8 - 3);
  return (code & 0x80) ? -magnitude : magnitude;
}

namespace {

struct Fp8Table {
  double value[256];
  Fp8Table() {
    for (int c = 0; c < 256; ++c) value[c] = decode_fp8_e4m3fnuz(static_cast<uint8_t>(c));
  }
};

const Fp8Table& fp8_table() {
  static const Fp8Table table;
  return table;
}

constexpr int kM = 32, kN = 32, kK = 16;

}  // namespace

void mfma_wave_f32_32x32x16_fp8(const uint64_t a[64], const uint64_t b[64], const float c[64][16], float d[64][16]) {
  const double* fp8 = fp8_table().value;
  double am[kM][kK], bm[kK][kN], dot[kM][kN] = {};
  for (int i = 0; i < kM; ++i)
    for (int k = 0; k < kK; ++k) am[i][k] = fp8[(a[i + 32 * (k / 8)] >> (8 * (k % 8))) & 0xff];
  for (int k = 0; k < kK; ++k)
    for (int j = 0; j < kN; ++j) bm[k][j] = fp8[(b[j + 32 * (k / 8)] >> (8 * (k % 8))) & 0xff];
  for (int i = 0; i < kM; ++i)
    for (int k = 0; k < kK; ++k)
      for (int j = 0; j < kN; ++j) dot[i][j] += am[i][k] * bm[k][j];
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      const int lane = j + 32 * ((i / 4) % 2), reg = 4 * (i / 8) + i % 4;
      d[lane][reg] = static_cast<float>(static_cast<double>(c[lane][reg]) + dot[i][j]);
    }
}

}  // namespace gfx942_emu
