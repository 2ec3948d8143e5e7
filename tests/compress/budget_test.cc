#include "compress/budget.h"
#include "compress/segment.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace anchorkv::compress {
namespace {

TEST(Budget, ByteFormulas) {
  EXPECT_EQ(residual_bytes(128, 2), 34);
  EXPECT_EQ(residual_bytes(64, 2), 18);
  EXPECT_EQ(residual_bytes(17, 3), 9);  // ceil(51 / 8) = 7, + 2
  EXPECT_EQ(residual_bytes(128, 1), 18);
  EXPECT_EQ(full_row_bytes(4096, 128), 2097152);
  EXPECT_EQ(base_row_bytes(4096, 32, 128), 32 * 512 + 4064 * 16);
}

TEST(Budget, EquationNineByHand) {
  // theta = 0.05, S = 4096, D = 128, 32 anchors:
  // (0.05 * 2097152 - 81408) / 34 = 689.69 -> 689.
  EXPECT_EQ(residual_budget(0.05, 2097152, 81408, 34), 689);
  EXPECT_EQ(residual_budget(0.0, 2097152, 81408, 34), 0);   // never negative
  EXPECT_EQ(residual_budget(0.02, 2097152, 81408, 34), 0);  // base above theta * full
  EXPECT_EQ(split_budget(689).keys, 344);
  EXPECT_EQ(split_budget(689).values, 345);
  EXPECT_EQ(split_budget(0).keys, 0);
}

TEST(Budget, AllocateTopPoolsRowsWithDeterministicTies) {
  const float inf = INFINITY;
  const std::vector<float> r0 = {5, -inf, 1, 3, 3};
  const std::vector<float> r1 = {3, 4, -inf, NAN, 0};
  const std::vector<std::span<const float>> rows = {r0, r1};
  auto c = allocate_top(rows, 3);  // 5 (r0,0), 4 (r1,1), then 3: tie r0,3 wins (lower row, position)
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{1}));
  c = allocate_top(rows, 4);
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{1}));
  c = allocate_top(rows, 100);  // capped: anchors (-inf) and NaN never chosen
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{0, 1, 4}));
  c = allocate_top(rows, 0);
  EXPECT_TRUE(c[0].empty() && c[1].empty());
}

TEST(Budget, TightLayoutBytes) {
  // 4 bytes per other token, 4 per anchor on top of its fp16 K and V, 2 per row.
  EXPECT_EQ(base_row_bytes(512, 4, 64, MetadataLayout::kTight), 4 * (256 + 4) + 508 * 4 + 2);
  EXPECT_EQ(base_row_bytes(512, 4, 64, MetadataLayout::kCompact), 4 * (256 + 4) + 508 * 8);
  EXPECT_EQ(max_anchors(MetadataLayout::kTight), 256);
}

// Every layout type reads back what it appended (ordinals, residual flags,
// coefficients as stored), fills its own buffers only, and its byte costs are
// what the row then holds.
TEST(RowLayout, EveryLayoutReadsBackWhatItAppendsAndCostsWhatItHolds) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
    CompressedRow row;
    row.layout = layout;
    row.length = 7;
    row.n_anchor = 2;
    const int64_t D = 4;
    row.anchor_k.assign(static_cast<size_t>(row.n_anchor * D), 0);
    row.anchor_v.assign(row.anchor_k.size(), 0);
    const std::vector<float> gk = {0.5f, -1.0f, 2.0f, 0.0f, 1.25f}, gv = {1.0f, 0.75f, -0.25f, 3.0f, -2.0f};
    std::vector<float> stored_k, stored_v;
    with_layout(layout, [&](auto L) {
      EXPECT_EQ(L.kKind, layout);
      if (L.kListsPositions) row.anchor_pos = {1, 4};
      L.begin(row, 3.0f, 3.0f);
      for (int e = 0; e < 5; ++e) {
        Meta m;
        m.anchor_k = e % 2;
        m.anchor_v = 1 - e % 2;
        m.res_k = e == 1;
        m.res_v = e == 3;
        L.append_fields(row, m);
        stored_k.push_back(L.append_coef(row.k, gk[e], m.res_k));
        stored_v.push_back(L.append_coef(row.v, gv[e], m.res_v));
      }
    });
    ASSERT_EQ(row.n_other(), 5) << to_string(layout);
    for (int e = 0; e < 5; ++e) {
      const Meta m = row.fields_at(e);
      EXPECT_EQ(m.anchor_k, e % 2) << to_string(layout);
      EXPECT_EQ(m.anchor_v, 1 - e % 2) << to_string(layout);
      EXPECT_EQ(row.res_k(e), e == 1) << to_string(layout);
      EXPECT_EQ(row.res_v(e), e == 3) << to_string(layout);
      EXPECT_EQ(row.coef_k(e), stored_k[e]) << to_string(layout);
      EXPECT_EQ(row.coef_v(e), stored_v[e]) << to_string(layout);
      EXPECT_NEAR(stored_k[e], gk[e], 0.05 * std::fabs(gk[e])) << to_string(layout);
    }
    for (int e : {1, 3}) {  // give the flagged tokens their residual slot
      CompressedSide& side = e == 1 ? row.k : row.v;
      side.codes.push_back(0);
      side.scales.push_back(0);
    }
    EXPECT_EQ(check_row(row, D, 1), "") << to_string(layout);
    const int64_t residual_bytes_held = 2 * (1 + 2);
    EXPECT_EQ(row.buffer_bytes(), base_row_bytes(row.length, row.n_anchor, D, layout) + residual_bytes_held)
        << to_string(layout);
  }
}

// The 8-bit coefficient: zero, sign, gamma = 1 exact, steps of 2^(1/8)
// (within 2^(1/16) of the value inside the row's range), the top code at the
// row's largest magnitude, the residual flag bit ignored by the decoder, and
// the table the kernels index equal to the scalar decoder bit for bit.
TEST(Budget, TightCoefficientCode) {
  for (float max_abs : {0.3f, 1.0f, 2.7f, 40.0f}) {
    const int e = tight_coef_exp(max_abs);
    SCOPED_TRACE(::testing::Message() << "max " << max_abs << " exp " << e);
    EXPECT_EQ(tight_coef_code(0.0f, e), 0);
    EXPECT_EQ(tight_coef(0, e), 0.0f);
    EXPECT_EQ(tight_coef(0x80, e), 0.0f);
    const uint8_t top = tight_coef_code(max_abs, e);
    EXPECT_GE(top & 0x3F, 60) << int{top};
    EXPECT_EQ(top & kTightResidual, 0);
    EXPECT_LE(std::fabs(tight_coef(top, e) / max_abs - 1.0f), 0.0443f);
    EXPECT_EQ(tight_coef(static_cast<uint8_t>(top | kTightResidual), e), tight_coef(top, e));
    if (max_abs >= 1.0f) {
      EXPECT_EQ(tight_coef(tight_coef_code(1.0f, e), e), 1.0f);
    }
    for (float g = -max_abs; g <= max_abs; g += max_abs / 97.0f) {
      if (std::fabs(g) < max_abs / 64.0f) continue;  // far below the range's top: coarse by design
      const float back = tight_coef(tight_coef_code(g, e), e);
      ASSERT_LE(std::fabs(back / g - 1.0f), 0.0443f) << g;  // 2^(1/16) - 1 = 0.04427
      ASSERT_EQ(back < 0, g < 0);
    }
    float table[256];
    tight_coef_table(e, table);
    for (int c = 0; c < 256; ++c) ASSERT_EQ(table[c], tight_coef(static_cast<uint8_t>(c), e)) << c;
  }
  // The table built without ldexp, bit for bit, at every exponent a row can
  // store (the extremes reach denormal and infinite magnitudes).
  for (int e = -128; e <= 127; ++e) {
    float table[256];
    tight_coef_table(e, table);
    for (int c = 0; c < 256; ++c) {
      const float want = tight_coef(static_cast<uint8_t>(c), e);
      uint32_t a, b;
      std::memcpy(&a, &table[c], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "exp " << e << " code " << c;
    }
  }
  EXPECT_EQ(tight_coef_exp(0.0f), 0);
  // Magnitudes below the lowest level 2^((1 + exp) / 8), rounded, become 0.
  EXPECT_EQ(tight_coef_exp(1.0f), -63);
  EXPECT_EQ(tight_coef_code(std::exp2(-62.0f / 8) * 0.97f, -63) & 0x3F, 1);
  EXPECT_EQ(tight_coef_code(std::exp2(-62.0f / 8) * 0.7f, -63), 0);
  EXPECT_EQ(tight_coef_exp(std::numeric_limits<float>::infinity()), 0);
}

}  // namespace
}  // namespace anchorkv::compress
