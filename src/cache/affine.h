// Affine (min/max) quantization shared by the quantized baselines:
// x ~ scale * q + zero with q in [0, 2^bits), fp16 scale and zero. Codes are
// packed LSB first at caller-chosen bit offsets; bits divide 8, so a code
// never straddles a byte.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace anchorkv::cache {

// Quantizes n values read with `stride` into params[0..1] (scale, zero) and
// the codes at bits bit0, bit0 + bit_stride, ... of `codes`, which the caller
// has zeroed.
void affine_quantize(const float* x, int64_t n, int64_t stride, int bits, uint16_t* params, uint8_t* codes,
                     int64_t bit0, int64_t bit_stride);

inline float affine_dequantize(const uint8_t* codes, int64_t bit, int bits, const uint16_t* params) {
  const int q = (codes[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
  return core::half_to_float(params[0]) * static_cast<float>(q) + core::half_to_float(params[1]);
}

}  // namespace anchorkv::cache
