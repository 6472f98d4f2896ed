// V_MFMA_F32_32X32X16_FP8_FP8 on one wavefront's registers (CDNA3), and the FP8 format it reads.
#pragma once
#include <cstdint>

namespace gfx942_emu {

// float8_e4m3fnuz (the CDNA3 "FP8"): 1 sign, 4 exponent bits with bias 8, 3 mantissa bits; no
// infinities; 0x80 (negative zero's encoding) is the only NaN; largest finite value 240.
double decode_fp8_e4m3fnuz(uint8_t code);

// d[lane][r] = the instruction's result for register r of lane, from the 64 lanes' A and B source
// registers (8 FP8 values each, as one 64-bit register pair) and C accumulators.
void mfma_wave_f32_32x32x16_fp8(const uint64_t a[64], const uint64_t b[64], const float c[64][16], float d[64][16]);

}  // namespace gfx942_emu
