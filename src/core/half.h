// fp16 / bf16 conversions (scalar, bit-exact IEEE round-to-nearest-even).
#pragma once

#include <cstdint>
#include <cstring>

namespace anchorkv::core {

inline constexpr float kFp16Max = 65504.0f;

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Table lookup: 65536 entries built once.
float half_to_float(uint16_t h);
// Round to nearest even; overflow -> Inf; NaN -> quiet NaN.
uint16_t float_to_half(float f);
inline float bf16_to_float(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
// The value fp16 storage keeps for f.
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }
// f as bf16, rounded as AVX-512 BF16's conversions (VCVTNEPS2BF16) round it:
// to nearest even, with inputs below FLT_MIN taken as zero (they ignore
// MXCSR: denormals are always flushed). NaN stays NaN.
inline float round_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t exponent = u & 0x7f800000u;
  if (exponent == 0x7f800000u) return f;  // Inf, NaN
  if (exponent == 0) return f32_from_bits(u & 0x80000000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return f32_from_bits(u & 0xffff0000u);
}

void half_to_float_n(const uint16_t* in, float* out, int64_t n);
void float_to_half_n(const float* in, uint16_t* out, int64_t n);

}  // namespace anchorkv::core
