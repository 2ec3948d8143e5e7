#include "compress/codec.h"

#include <cmath>

#include "core/bitpack.h"
#include "core/codebook.h"
#include "core/half.h"

namespace anchorkv::compress {

ResidualCodec::ResidualCodec(int64_t dim, int bits, ResidualScale scale, uint64_t seed)
    : dim_(dim), bits_(bits), scale_(scale), rotation_(dim, seed), levels_(core::gaussian_codebook(bits)) {}

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
  core::unpack_codes(codes, dim_, bits_, scratch);
  const float s = core::half_to_float(scale);
  for (int64_t i = 0; i < dim_; ++i) out[i] = s * levels_[scratch[i]];
}

void ResidualCodec::decode(const uint8_t* codes, uint16_t scale, float* out, uint8_t* scratch) const {
  decode_rotated(codes, scale, out, scratch);
  rotation_.inverse(out, out);
}

}  // namespace anchorkv::compress
