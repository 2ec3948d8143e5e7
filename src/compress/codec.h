// Residual codec (docs/spec.md §4.5): seeded orthogonal rotation, one fp16 scale per
// token, nearest Lloyd-Max level of N(0,1) per coordinate, packed codes.
//   encode: z = R r; s = fp16(absmax(z)) or fp16(||z|| / sqrt(D)) (saturating);
//           code_i = nearest level of z_i / s (all codes of the level nearest 0 when s == 0)
//   decode: r^ = R^T (s * level[code])
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "anchorkv/config.h"
#include "core/rotation.h"

namespace anchorkv::compress {

class ResidualCodec {
 public:
  ResidualCodec(int64_t dim, int bits, ResidualScale scale, uint64_t seed);

  int64_t dim() const { return dim_; }
  int bits() const { return bits_; }
  ResidualScale scale_kind() const { return scale_; }
  int64_t code_bytes() const { return (dim_ * bits_ + 7) / 8; }
  const core::Rotation& rotation() const { return rotation_; }
  std::span<const float> levels() const { return levels_; }

  // r: [D]. codes_out: code_bytes() bytes. scratch: 2*D floats.
  void encode(const float* r, uint8_t* codes_out, uint16_t* scale_out, float* scratch) const;
  // out = s * level[code] in the rotated domain. scratch: D bytes.
  void decode_rotated(const uint8_t* codes, uint16_t scale, float* out, uint8_t* scratch) const;
  // out = level[code] (unscaled, rotated domain); the caller applies the scale.
  void decode_levels(const uint8_t* codes, float* out, uint8_t* scratch) const;
  // The same for n codes stored one after another (out [n, D]): one SIMD pass
  // over the run where each code ends on a byte (D * bits % 8 == 0), else one
  // decode_levels per code. scratch: D bytes.
  void decode_levels_run(const uint8_t* codes, int64_t n, float* out, uint8_t* scratch) const;
  // out = R^T (s * level[code]). scratch: D bytes.
  void decode(const uint8_t* codes, uint16_t scale, float* out, uint8_t* scratch) const;

 private:
  int64_t dim_;
  int bits_;
  ResidualScale scale_;
  core::Rotation rotation_;
  std::span<const float> levels_;
  // For 1, 2 and 4 bits: the 8/bits levels each byte value unpacks to
  // ([256, 8/bits]); decoding is then a table lookup per byte.
  std::vector<float> byte_lut_;
};

}  // namespace anchorkv::compress
