// The packed sub-block scales of the K-quants, shared by the integer kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace anchorkv::model {

// The eight 6-bit scales and eight minimums of a Q4_K / Q5_K super-block from
// its 12 packed bytes, with 32-bit word operations (a byte per value; the
// layout of dequant.cc's scale_min_k4: scales 0-3 and minimums 0-3 in the low
// 6 bits of bytes 0-7, the others' low 4 bits in bytes 8-11 and high 2 bits in
// the top of bytes 0-7). Little-endian words, as GGUF itself.
inline void unpack_scales_k4(const uint8_t* packed, uint8_t sc[8], uint8_t m[8]) {
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  const uint32_t scales_lo = u[0] & k6, mins_lo = u[1] & k6;
  const uint32_t scales_hi = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);
  const uint32_t mins_hi = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);
  std::memcpy(sc, &scales_lo, 4);
  std::memcpy(sc + 4, &scales_hi, 4);
  std::memcpy(m, &mins_lo, 4);
  std::memcpy(m + 4, &mins_hi, 4);
}

// The inverse: 12 packed bytes from scales and minimums below 64 (every
// packed pattern round-trips through the two).
inline void pack_scales_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

}  // namespace anchorkv::model
