#include "core/bitpack.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"

namespace anchorkv::core {
namespace {

TEST(Bitpack, RoundTripsAllWidthsAndLengths) {
  Rng rng(11);
  for (int bits = 1; bits <= 4; ++bits) {
    for (int64_t n = 0; n <= 131; ++n) {
      std::vector<uint8_t> codes(static_cast<size_t>(n)), back(static_cast<size_t>(n));
      for (auto& c : codes) c = static_cast<uint8_t>(rng.below(1u << bits));
      std::vector<uint8_t> packed(static_cast<size_t>(packed_bytes(n, bits)) + 1, 0xAB);
      pack_codes(codes.data(), n, bits, packed.data());
      EXPECT_EQ(packed.back(), 0xAB) << "wrote past ceil(n*bits/8)";
      unpack_codes(packed.data(), n, bits, back.data());
      ASSERT_EQ(codes, back) << bits << " bits, n=" << n;
    }
  }
}

TEST(Bitpack, SizesAndKnownLayout) {
  EXPECT_EQ(packed_bytes(128, 2), 32);
  EXPECT_EQ(packed_bytes(128, 3), 48);
  EXPECT_EQ(packed_bytes(17, 3), 7);
  EXPECT_EQ(packed_bytes(17, 1), 3);
  // 3-bit codes cross byte boundaries, LSB first.
  const uint8_t codes[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  uint8_t out[3];
  pack_codes(codes, 8, 3, out);
  EXPECT_EQ(out[0], 0xD1);
  EXPECT_EQ(out[1], 0x58);
  EXPECT_EQ(out[2], 0x1F);
  const uint8_t two[4] = {3, 0, 1, 2};
  uint8_t o2;
  pack_codes(two, 4, 2, &o2);
  EXPECT_EQ(o2, 0b10010011);
}

}  // namespace
}  // namespace anchorkv::core
