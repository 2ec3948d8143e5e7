#include "core/bitpack.h"

#include <cstring>

namespace anchorkv::core {

void pack_codes(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>(packed_bytes(n, bits)));
  if (8 % bits == 0) {  // 1, 2, 4 bits: codes never straddle a byte
    const int per = 8 / bits;
    for (int64_t i = 0; i < n; ++i)
      out[i / per] |= static_cast<uint8_t>(codes[i] << ((i % per) * bits));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = i * bits;
    const uint32_t v = static_cast<uint32_t>(codes[i]) << (bit & 7);
    out[bit >> 3] |= static_cast<uint8_t>(v);
    if ((bit & 7) + bits > 8) out[(bit >> 3) + 1] |= static_cast<uint8_t>(v >> 8);
  }
}

void unpack_codes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  const uint32_t mask = (1u << bits) - 1;
  if (8 % bits == 0) {
    const int per = 8 / bits;
    for (int64_t i = 0; i < n; ++i)
      codes[i] = static_cast<uint8_t>((packed[i / per] >> ((i % per) * bits)) & mask);
    return;
  }
  const int64_t total = packed_bytes(n, bits);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = i * bits;
    uint32_t v = packed[bit >> 3];
    if ((bit >> 3) + 1 < total) v |= static_cast<uint32_t>(packed[(bit >> 3) + 1]) << 8;
    codes[i] = static_cast<uint8_t>((v >> (bit & 7)) & mask);
  }
}

}  // namespace anchorkv::core
