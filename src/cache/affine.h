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

// One side of one row of affine codes as attention reads them, tokens counted
// from the region's first: token t's codes start at byte t * token_bytes,
// channel d's at bit d * bits of them. Its (scale, zero) pair is per token and
// group of `channel_group` channels (token_group == 0: group quantization,
// KIVI's values) or per channel and group of `token_group` tokens (KIVI's keys).
struct AffineSideView {
  const uint8_t* codes = nullptr;
  const uint16_t* params = nullptr;
  int bits = 0;
  int64_t token_bytes = 0;
  int64_t channel_group = 0;
  int64_t token_group = 0;

  const uint16_t* params_of(int64_t t, int64_t d, int64_t D) const {
    if (token_group > 0) return params + ((t / token_group) * D + d) * 2;
    return params + (t * ((D + channel_group - 1) / channel_group) + d / channel_group) * 2;
  }
  float value(int64_t t, int64_t d, int64_t D) const {
    return affine_dequantize(codes + t * token_bytes, d * bits, bits, params_of(t, d, D));
  }
};
struct AffineRowView {
  AffineSideView k, v;
};

// Whether attention can read codes of `bits` bits for head dim D in place:
// every token's codes fill whole bytes (D * bits a multiple of 8), so a run of
// tokens is one stream of codes, and so does each group of `channel_group`
// channels that shares a (scale, zero) pair.
inline bool affine_attention_supported(int64_t D, int bits, int64_t channel_group) {
  return D * bits % 8 == 0 && (channel_group >= D || channel_group * bits % 8 == 0);
}

}  // namespace anchorkv::cache
