// Bit packing of b-bit codes (b in 1..4), LSB first: code i occupies bits
// [i*b, (i+1)*b) of a little-endian bit stream, so 3-bit codes cross byte
// boundaries and n codes take ceil(n*b/8) bytes. Unused high bits of the last
// byte are zero.
#pragma once

#include <cstdint>

namespace anchorkv::core {

inline int64_t packed_bytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

// out must hold packed_bytes(n, bits) bytes; codes must be < 2^bits.
void pack_codes(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void unpack_codes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes);

}  // namespace anchorkv::core
