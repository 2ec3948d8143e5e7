#include "core/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "core/half.h"

namespace anchorkv::core {
namespace {

TEST(RopeTable, MatchesExactAnglesAndDoesNotDependOnHowItGrew) {
  const int64_t D = 64, half = D / 2;
  const double base = 12345.0;  // a base no other test uses: this test sees the table grow
  const RopeOptions rope{true, base, RopeStyle::kNormal, 0, {}};
  const auto small = shared_rope_table(rope, D, 10);
  ASSERT_GE(small->n, 10);
  EXPECT_EQ(small->n % kRopeBlock, 0);
  const auto big = shared_rope_table(rope, D, 3 * kRopeBlock + 5);
  ASSERT_GE(big->n, 3 * kRopeBlock + 5);
  EXPECT_GE(small->n, 10);                                    // the old snapshot stays valid for its holders
  EXPECT_EQ(shared_rope_table(rope, D, 7).get(), big.get());  // covered: no rebuild
  // Small: rows of the first kRopeStep positions and of every kRopeStep-th.
  EXPECT_EQ(big->near_cos.size(), static_cast<size_t>(kRopeStep * half));
  EXPECT_EQ(big->step_cos.size(), static_cast<size_t>(big->n / kRopeStep * half));
  // Every row is a function of (base, D, p) alone: the same as rows built in
  // one go from the exact start of its block, and within 1e-6 of exact sincos.
  AlignedVector<float> nc(static_cast<size_t>(kRopeStep * half)), ns(nc.size());
  rope_table(0, kRopeStep, D, rope, nc.data(), ns.data());
  EXPECT_EQ(big->near_cos, nc);
  EXPECT_EQ(big->near_sin, ns);
  for (int64_t b = 0; b < big->n / kRopeStep; ++b) {
    const int64_t block = b * kRopeStep / kRopeBlock * kRopeBlock, per = kRopeBlock / kRopeStep;
    std::vector<float> bc(static_cast<size_t>(per * half)), bs(bc.size());
    rope_table(block, per, D, rope, bc.data(), bs.data(), kRopeStep);
    const size_t at = static_cast<size_t>((b - block / kRopeStep) * half);
    for (int64_t i = 0; i < half; ++i) {
      ASSERT_EQ(big->step_cos[static_cast<size_t>(b * half + i)], bc[at + i]) << b;
      ASSERT_EQ(big->step_sin[static_cast<size_t>(b * half + i)], bs[at + i]) << b;
      if (b < small->n / kRopeStep) {
        ASSERT_EQ(small->step_cos[static_cast<size_t>(b * half + i)], bc[at + i]);
      }
    }
  }
  // Any position's angles (step row x near row), and a rotation to it, match exact sincos.
  for (int64_t p : {int64_t{0}, int64_t{1}, kRopeStep - 1, kRopeStep, kRopeBlock - 1, kRopeBlock,
                    2 * kRopeBlock + 17, 3 * kRopeBlock + 4}) {
    std::vector<float> c(half), s(half), x(D), y(D);
    big->angles(p, c.data(), s.data());
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(p) * std::pow(base, -2.0 * static_cast<double>(i) / D);
      EXPECT_NEAR(c[i], std::cos(ang), 1e-6) << p << "," << i;
      EXPECT_NEAR(s[i], std::sin(ang), 1e-6) << p << "," << i;
    }
    for (int64_t i = 0; i < D; ++i) x[i] = y[i] = static_cast<float>(std::sin(0.9 * static_cast<double>(i)));
    big->rotate(x.data(), RopeStyle::kNeox, p);
    rope_rotate_at(y.data(), D, RopeOptions{true, base, RopeStyle::kNeox, 0, {}}, p);
    for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(x[i], y[i], 2e-6) << p << "," << i;
  }
}

// Scaled frequencies (a model's RoPE scaling): pair i turns by
// base^(-2i/D) * freq_scale[i]; tables of scaled and unscaled angles are
// distinct, and malformed scales are named.
TEST(RopeTable, ScaledFrequenciesTurnEachPairByItsScale) {
  const int64_t D = 16, half = D / 2;
  RopeOptions plain{true, 54321.0, RopeStyle::kNormal, 0, {}};
  RopeOptions scaled = plain;
  for (int64_t i = 0; i < half; ++i) scaled.freq_scale.push_back(1.0 / (1.0 + static_cast<double>(i)));
  EXPECT_TRUE(rope_problem(scaled, D).empty());
  EXPECT_FALSE(same_angles(plain, scaled));
  const auto tp = shared_rope_table(plain, D, 3000), ts = shared_rope_table(scaled, D, 3000);
  EXPECT_NE(tp.get(), ts.get());
  for (int64_t p : {int64_t{3}, int64_t{1000}, int64_t{2999}}) {
    std::vector<float> c(half), s(half), x(D), y(D);
    ts->angles(p, c.data(), s.data());
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(p) * std::pow(54321.0, -2.0 * static_cast<double>(i) / D) /
                         (1.0 + static_cast<double>(i));
      EXPECT_NEAR(c[i], std::cos(ang), 1e-6) << p << "," << i;
      EXPECT_NEAR(s[i], std::sin(ang), 1e-6) << p << "," << i;
    }
    for (int64_t i = 0; i < D; ++i) x[i] = y[i] = static_cast<float>(std::cos(0.4 * static_cast<double>(i)));
    ts->rotate(x.data(), RopeStyle::kNormal, p);
    rope_rotate_at(y.data(), D, scaled, p);
    for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(x[i], y[i], 2e-6) << p << "," << i;
  }
  RopeOptions bad = scaled;
  bad.freq_scale.pop_back();
  EXPECT_NE(rope_problem(bad, D).find("7 values for 8 pairs"), std::string::npos) << rope_problem(bad, D);
  bad = scaled;
  bad.freq_scale[2] = 0.0;
  EXPECT_NE(rope_problem(bad, D).find("finite and > 0"), std::string::npos);
  bad.freq_scale[2] = std::nan("");
  EXPECT_FALSE(rope_problem(bad, D).empty());
}

TEST(RopeTable, ConcurrentRequestsAgree) {
  std::vector<std::shared_ptr<const RopeTable>> got(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] { got[t] = shared_rope_table(RopeOptions{true, 777.0, RopeStyle::kNormal, 0, {}}, 32, (t + 1) * 1500); });
  for (auto& t : ts) t.join();
  for (const auto& g : got) {
    ASSERT_EQ(g->near_cos, got[3]->near_cos);
    for (size_t i = 0; i < g->step_cos.size(); ++i) ASSERT_EQ(g->step_cos[i], got[3]->step_cos[i]);
  }
}

// The SIMD rotation equals its scalar twin (up to fused multiply-add rounding)
// for both pair layouts, odd pair counts (a scalar tail) and the inverse, and
// the inverse undoes the rotation.
TEST(RopeRotate, SimdMatchesScalarTwinForEveryLayout) {
  for (int64_t D : {2, 6, 16, 34, 64, 80, 128, 256})
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
      for (bool inverse : {false, true}) {
        std::vector<float> c(static_cast<size_t>(D / 2)), s(c.size()), x(static_cast<size_t>(D));
        rope_table(1234, 1, D, RopeOptions{true, 10000.0, RopeStyle::kNormal, 0, {}}, c.data(), s.data());
        for (int64_t i = 0; i < D; ++i) x[i] = std::sin(0.7 * static_cast<double>(i) + 0.3) * 3.0f;
        std::vector<float> fast = x, ref = x;
        rope_rotate(fast.data(), D, style, c.data(), s.data(), inverse);
        rope_rotate_ref(ref.data(), D, style, c.data(), s.data(), inverse);
        for (int64_t i = 0; i < D; ++i)
          ASSERT_NEAR(fast[i], ref[i], 1e-6f * 3.0f) << "D " << D << " style " << static_cast<int>(style) << " i " << i;
        EXPECT_NE(fast, x) << "nothing rotated";
        rope_rotate(fast.data(), D, style, c.data(), s.data(), !inverse);
        for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(fast[i], x[i], 1e-5f) << "round trip, D " << D;
      }
}

// Split rows of fp16 bits (the pre-RoPE kernel's anchors, as stored) are
// the f32 split of the same values, for both pairings.
TEST(RopeSplit, HalfBitsSplitLikeTheirValues) {
  const int64_t D = 128;
  std::vector<uint16_t> h(D), hs(D);
  std::vector<float> x(D), xs(D);
  for (int64_t i = 0; i < D; ++i) {
    h[i] = float_to_half(static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 5.0));
    x[i] = half_to_float(h[i]);
  }
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    rope_split(h.data(), D, style, hs.data());
    rope_split(x.data(), D, style, xs.data());
    for (int64_t i = 0; i < D; ++i)
      ASSERT_EQ(half_to_float(hs[i]), xs[i]) << "style " << static_cast<int>(style);
  }
  rope_split(h.data(), D, RopeStyle::kNormal, hs.data());
  EXPECT_EQ(hs[1], h[2]);  // the normal pairing's second x is element 2
  EXPECT_EQ(hs[D / 2], h[1]);
}

// Near positions come from the shared table, far ones (p0 > n) from exact
// sincos: the same rotation either way, and inverse undoes it.
TEST(PositionRotator, TableAndExactAnglesAgree) {
  const int64_t D = 64;
  const RopeOptions rope{true, 500000.0, RopeStyle::kNeox, 0, {}};
  const PositionRotator near(rope, D, 0, 5000), far(rope, D, 4000, 100);
  std::vector<float> x(D);
  for (int64_t i = 0; i < D; ++i) x[i] = static_cast<float>(std::cos(1.3 * static_cast<double>(i)));
  for (int64_t p : {4000, 4057, 4099}) {
    std::vector<float> a = x, b = x;
    near.rotate(a.data(), p);
    far.rotate(b.data(), p);
    for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(a[i], b[i], 1e-5f) << "p " << p << " i " << i;
    EXPECT_NE(a, x);
    far.rotate(b.data(), p, /*inverse=*/true);
    for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(b[i], x[i], 1e-5f);
  }
}

}  // namespace
}  // namespace anchorkv::core
