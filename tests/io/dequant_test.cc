// Each GGML block type is encoded here element by element from the format's
// description (where every element's bits, scale and min live), then decoded
// by dequantize_row and compared with the value the format defines. The
// encoder indexes by element; the decoder walks ggml's loops, so a layout slip
// in either shows up.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "anchorkv/status.h"
#include "core/half.h"
#include "io/gguf.h"

namespace anchorkv::io {
namespace {

struct Block {
  std::vector<uint8_t> bytes;
  std::vector<float> expect;
  void bits(int64_t byte, int shift, int n, int value) {
    const int mask = (1 << n) - 1;
    bytes[byte] = static_cast<uint8_t>((bytes[byte] & ~(mask << shift)) | ((value & mask) << shift));
  }
  void half(int64_t byte, float v) {
    const uint16_t h = core::float_to_half(v);
    std::memcpy(&bytes[byte], &h, 2);
  }
};

// A representable fp16 scale.
float hscale(std::mt19937& g, float lo, float hi) {
  return core::round_to_half(std::uniform_real_distribution<float>(lo, hi)(g));
}
int rnd(std::mt19937& g, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }

Block encode(GgmlType t, std::mt19937& g) {
  int64_t be = 0, bb = 0;
  EXPECT_TRUE(ggml_block(t, &be, &bb));
  Block b{std::vector<uint8_t>(bb, 0), std::vector<float>(be, 0.0f)};
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const bool min = t == GgmlType::kQ4_1;
      const float d = hscale(g, -1, 1), m = min ? hscale(g, -2, 2) : 0.0f;
      b.half(0, d);
      if (min) b.half(2, m);
      for (int e = 0; e < 32; ++e) {
        const int q = rnd(g, 0, 15);
        b.bits((min ? 4 : 2) + e % 16, e < 16 ? 0 : 4, 4, q);
        b.expect[e] = min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 8);
      }
      break;
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool min = t == GgmlType::kQ5_1;
      const float d = hscale(g, -1, 1), m = min ? hscale(g, -2, 2) : 0.0f;
      b.half(0, d);
      if (min) b.half(2, m);
      const int qh = min ? 4 : 2, qs = qh + 4;
      for (int e = 0; e < 32; ++e) {
        const int q = rnd(g, 0, 31);
        b.bits(qs + e % 16, e < 16 ? 0 : 4, 4, q & 15);
        b.bits(qh + e / 8, e % 8, 1, q >> 4);
        b.expect[e] = min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
      }
      break;
    }
    case GgmlType::kQ8_0: {
      const float d = hscale(g, -1, 1);
      b.half(0, d);
      for (int e = 0; e < 32; ++e) {
        const int q = rnd(g, -128, 127);
        b.bytes[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(q));
        b.expect[e] = d * static_cast<float>(q);
      }
      break;
    }
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K: {
      // 16 groups of 16: element e -> half e/128, shift slot j, part, lane l.
      const bool three = t == GgmlType::kQ3_K;
      const float d = hscale(g, -1, 1), dmin = three ? 0.0f : hscale(g, -1, 1);
      int sc[16], mn[16];
      for (int s = 0; s < 16; ++s) {
        sc[s] = three ? rnd(g, 0, 63) : rnd(g, 0, 15);
        mn[s] = three ? 0 : rnd(g, 0, 15);
        if (three) {
          b.bits(96 + (s < 8 ? s : s - 8), s < 8 ? 0 : 4, 4, sc[s] & 15);
          b.bits(96 + 8 + s % 4, 2 * (s / 4), 2, sc[s] >> 4);
        } else {
          b.bytes[s] = static_cast<uint8_t>(sc[s] | (mn[s] << 4));
        }
      }
      if (three) {
        b.half(108, d);
      } else {
        b.half(80, d);
        b.half(82, dmin);
      }
      for (int e = 0; e < 256; ++e) {
        const int half = e / 128, r = e % 128, j = r / 32, part = (r % 32) / 16, l = r % 16,
                  idx = l + 16 * part;
        const int s = half * 8 + j * 2 + part, q = rnd(g, 0, 3);
        b.bits((three ? 32 : 16) + half * 32 + idx, 2 * j, 2, q);
        if (three) {
          const int hbit = rnd(g, 0, 1);
          b.bits(idx, half * 4 + j, 1, hbit);
          b.expect[e] = d * static_cast<float>(sc[s] - 32) * static_cast<float>(q - (hbit ? 0 : 4));
        } else {
          b.expect[e] =
              d * static_cast<float>(sc[s]) * static_cast<float>(q) - dmin * static_cast<float>(mn[s]);
        }
      }
      break;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = t == GgmlType::kQ5_K;
      const float d = hscale(g, 0, 1), dmin = hscale(g, 0, 1);
      b.half(0, d);
      b.half(2, dmin);
      int sc[8], mn[8];
      for (int gr = 0; gr < 8; ++gr) {
        sc[gr] = rnd(g, 0, 63);
        mn[gr] = rnd(g, 0, 63);
        if (gr < 4) {
          b.bits(4 + gr, 0, 6, sc[gr]);
          b.bits(4 + gr + 4, 0, 6, mn[gr]);
        } else {
          b.bits(4 + gr + 4, 0, 4, sc[gr] & 15);
          b.bits(4 + gr + 4, 4, 4, mn[gr] & 15);
          b.bits(4 + gr - 4, 6, 2, sc[gr] >> 4);
          b.bits(4 + gr, 6, 2, mn[gr] >> 4);
        }
      }
      for (int e = 0; e < 256; ++e) {
        const int gr = e / 32, l = e % 32, q = rnd(g, 0, five ? 31 : 15);
        b.bits((five ? 48 : 16) + (gr / 2) * 32 + l, gr % 2 ? 4 : 0, 4, q & 15);
        if (five) b.bits(16 + l, gr, 1, q >> 4);
        b.expect[e] =
            d * static_cast<float>(sc[gr]) * static_cast<float>(q) - dmin * static_cast<float>(mn[gr]);
      }
      break;
    }
    case GgmlType::kQ6_K: {
      const float d = hscale(g, -1, 1);
      b.half(208, d);
      int sc[16];
      for (int s = 0; s < 16; ++s) {
        sc[s] = rnd(g, -128, 127);
        b.bytes[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc[s]));
      }
      for (int e = 0; e < 256; ++e) {
        const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32, q = rnd(g, 0, 63);
        b.bits(half * 64 + l + (quarter & 1) * 32, quarter >= 2 ? 4 : 0, 4, q & 15);
        b.bits(128 + half * 32 + l, 2 * quarter, 2, q >> 4);
        const int s = half * 8 + l / 16 + 2 * quarter;
        b.expect[e] = d * static_cast<float>(sc[s]) * static_cast<float>(q - 32);
      }
      break;
    }
    default:
      ADD_FAILURE() << "no encoder for " << ggml_type_name(t);
  }
  return b;
}

class Dequant : public ::testing::TestWithParam<GgmlType> {};

TEST_P(Dequant, EveryElementDecodesToTheFormatsValue) {
  const GgmlType t = GetParam();
  ASSERT_TRUE(can_dequantize(t));
  std::mt19937 g(7u + static_cast<unsigned>(t));
  // Three blocks in one row: offsets between blocks are exercised too.
  std::vector<uint8_t> row;
  std::vector<float> expect;
  for (int i = 0; i < 3; ++i) {
    const Block b = encode(t, g);
    row.insert(row.end(), b.bytes.begin(), b.bytes.end());
    expect.insert(expect.end(), b.expect.begin(), b.expect.end());
  }
  std::vector<float> got(expect.size(), -999.0f), ref(expect.size(), -999.0f);
  dequantize_row(t, row.data(), static_cast<int64_t>(got.size()), got.data());
  dequantize_row_ref(t, row.data(), static_cast<int64_t>(ref.size()), ref.data());
  // The SIMD kernels (Q8_0, Q4_0, Q4_K, Q6_K) equal the scalar reference bit for bit.
  ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * sizeof(float))) << ggml_type_name(t);
  for (size_t i = 0; i < got.size(); ++i) {
    // The decoder multiplies in a different order (d * sc first): a few ulps.
    ASSERT_NEAR(got[i], expect[i], 1e-5f * (1.0f + std::abs(expect[i])))
        << ggml_type_name(t) << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllBlockTypes, Dequant,
                         ::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                                           GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

TEST(DequantErrors, UnknownTypesAndPartialBlocksAreNamed) {
  std::vector<uint8_t> src(512, 0);
  std::vector<float> dst(256);
  EXPECT_FALSE(can_dequantize(GgmlType::kQ8_K));
  try {
    dequantize_row(GgmlType::kQ8_K, src.data(), 256, dst.data());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("Q8_K"), std::string::npos);
  }
  try {
    dequantize_row(GgmlType::kQ4_K, src.data(), 100, dst.data());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace anchorkv::io
