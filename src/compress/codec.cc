#include "compress/codec.h"

#include <cmath>
#include <cstring>

#include "core/bitpack.h"
#include "core/codebook.h"
#include "core/half.h"
#include "core/linalg.h"

namespace anchorkv::compress {

ResidualCodec::ResidualCodec(int64_t dim, int bits, ResidualScale scale, uint64_t seed)
    : dim_(dim), bits_(bits), scale_(scale), rotation_(dim, seed), levels_(core::gaussian_codebook(bits)) {
  if (8 % bits == 0) {
    const int per = 8 / bits;
    byte_lut_.resize(static_cast<size_t>(256 * per));
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < per; ++i) byte_lut_[b * per + i] = levels_[(b >> (i * bits)) & ((1 << bits) - 1)];
  }
}

void ResidualCodec::encode(const float* r, uint8_t* codes_out, uint16_t* scale_out, float* scratch) const {
  float* z = scratch;
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch + dim_);
  rotation_.forward(r, z);
  float s = 0;
  if (scale_ == ResidualScale::kAbsMax) {
    for (int64_t i = 0; i < dim_; ++i) s = std::fmax(s, std::fabs(z[i]));
  } else {
    double ss = 0;
    for (int64_t i = 0; i < dim_; ++i) ss += static_cast<double>(z[i]) * z[i];
    s = static_cast<float>(std::sqrt(ss / static_cast<double>(dim_)));
  }
  const uint16_t s16 = core::float_to_half(std::fmin(s, core::kFp16Max));
  const float sq = core::half_to_float(s16);
  const float inv = sq > 0 ? 1.0f / sq : 0.0f;
  for (int64_t i = 0; i < dim_; ++i) codes[i] = core::nearest_level(levels_, z[i] * inv);
  core::pack_codes(codes, dim_, bits_, codes_out);
  *scale_out = s16;
}

void ResidualCodec::decode_rotated(const uint8_t* codes, uint16_t scale, float* out, uint8_t* scratch) const {
  const float s = core::half_to_float(scale);
  if (!byte_lut_.empty()) {  // same values as the generic path, one lookup per byte
    const int per = 8 / bits_;
    const int64_t full = dim_ / per;
    for (int64_t b = 0; b < full; ++b) {
      const float* lv = &byte_lut_[static_cast<size_t>(codes[b]) * per];
      for (int i = 0; i < per; ++i) out[b * per + i] = s * lv[i];
    }
    for (int64_t i = full * per; i < dim_; ++i)
      out[i] = s * levels_[(codes[i / per] >> ((i % per) * bits_)) & ((1 << bits_) - 1)];
    return;
  }
  core::unpack_codes(codes, dim_, bits_, scratch);
  for (int64_t i = 0; i < dim_; ++i) out[i] = s * levels_[scratch[i]];
}

namespace {
// Copy the table row of every code byte; PER (codes per byte) is a constant so
// each copy is one fixed-size move.
template <int PER>
void lookup_bytes(const uint8_t* codes, const float* lut, int64_t n_bytes, float* out) {
  for (int64_t b = 0; b < n_bytes; ++b) std::memcpy(out + b * PER, lut + codes[b] * PER, sizeof(float) * PER);
}
}  // namespace

void ResidualCodec::decode_levels(const uint8_t* codes, float* out, uint8_t* scratch) const {
  if (bits_ == 2) {  // the default: SIMD lane permutation of the 4 levels
    core::decode_codes_2bit(codes, levels_.data(), dim_, out);
    return;
  }
  if (!byte_lut_.empty()) {
    const int per = 8 / bits_;
    const int64_t full = dim_ / per;
    switch (per) {
      case 8:
        lookup_bytes<8>(codes, byte_lut_.data(), full, out);
        break;
      case 4:
        lookup_bytes<4>(codes, byte_lut_.data(), full, out);
        break;
      default:
        lookup_bytes<2>(codes, byte_lut_.data(), full, out);
        break;
    }
    for (int64_t i = full * per; i < dim_; ++i)
      out[i] = levels_[(codes[i / per] >> ((i % per) * bits_)) & ((1 << bits_) - 1)];
    return;
  }
  core::unpack_codes(codes, dim_, bits_, scratch);
  for (int64_t i = 0; i < dim_; ++i) out[i] = levels_[scratch[i]];
}

void ResidualCodec::decode_levels_run(const uint8_t* codes, int64_t n, float* out, uint8_t* scratch) const {
  if (dim_ * bits_ % 8 != 0) {
    for (int64_t i = 0; i < n; ++i) decode_levels(codes + i * code_bytes(), out + i * dim_, scratch);
    return;
  }
  // Byte-aligned codes: the run is one stream of n * D codes.
  const int64_t total = n * dim_;
  if (bits_ == 2)
    core::decode_codes_2bit(codes, levels_.data(), total, out);
  else
    core::decode_codes(codes, bits_, levels_.data(), total, out);
}

void ResidualCodec::decode(const uint8_t* codes, uint16_t scale, float* out, uint8_t* scratch) const {
  decode_rotated(codes, scale, out, scratch);
  rotation_.inverse(out, out);
}

}  // namespace anchorkv::compress
