// Lloyd-Max codebooks for a unit Gaussian (the MSE-optimal scalar quantizer of
// N(0, 1)), 1 to 4 bits. Levels are symmetric; code i is the i-th level in
// ascending order. Positive halves (computed by Lloyd's iteration to a fixed
// point; the test re-derives them):
//   1 bit: 0.7978846                       (= sqrt(2/pi))
//   2 bit: 0.4527800 1.5104176
//   3 bit: 0.2450942 0.7560053 1.3439093 2.1519457
//   4 bit: 0.1283950 0.3880483 0.6567591 0.9423405
//          1.2562312 1.6180464 2.0690172 2.7325896
#pragma once

#include <cstdint>
#include <span>

namespace anchorkv::core {

// The 2^bits levels, ascending. bits in 1..4.
std::span<const float> gaussian_codebook(int bits);

// Index of the nearest level (ties go to the lower index).
inline uint8_t nearest_level(std::span<const float> levels, float x) {
  // Levels are few (<= 16): count the decision boundaries below x.
  uint8_t code = 0;
  const size_t n = levels.size();
  for (size_t i = 0; i + 1 < n; ++i) code += (x > 0.5f * (levels[i] + levels[i + 1])) ? 1 : 0;
  return code;
}

}  // namespace anchorkv::core
