#include "core/half.h"

#include <array>
#include <cmath>

#include "anchorkv/tensor.h"

namespace anchorkv::core {
namespace {

// Exact conversion via float arithmetic (the well-known FP16 trick: the
// additions below are exact or perform the IEEE rounding we want).
float half_to_float_compute(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
  const uint32_t cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < cutoff ? f32_bits(denormalized) : f32_bits(normalized));
  return f32_from_bits(result);
}

const std::array<float, 65536>& table() {
  static const std::array<float, 65536> t = [] {
    std::array<float, 65536> a{};
    for (uint32_t i = 0; i < 65536; ++i) a[i] = half_to_float_compute(static_cast<uint16_t>(i));
    return a;
  }();
  return t;
}

}  // namespace

float half_to_float(uint16_t h) { return table()[h]; }

uint16_t float_to_half(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

void half_to_float_n(const uint16_t* in, float* out, int64_t n) {
  const auto& t = table();
  for (int64_t i = 0; i < n; ++i) out[i] = t[in[i]];
}

void float_to_half_n(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

}  // namespace anchorkv::core

namespace anchorkv {
float fp16_to_f32(uint16_t bits) { return core::half_to_float(bits); }
uint16_t f32_to_fp16(float value) { return core::float_to_half(value); }
float bf16_to_f32(uint16_t bits) { return core::bf16_to_float(bits); }
}  // namespace anchorkv
