#include "core/codebook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace anchorkv::core {
namespace {

// Lloyd's iteration for N(0,1) in double, from scratch.
std::vector<double> lloyd_max(int bits) {
  const int n = 1 << bits;
  auto pdf = [](double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); };
  auto cdf = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
  std::vector<double> c(n);
  for (int i = 0; i < n; ++i) c[i] = -2 + 4 * (i + 0.5) / n;
  for (int it = 0; it < 5000; ++it) {
    std::vector<double> nc(n);
    for (int i = 0; i < n; ++i) {
      const double lo = i == 0 ? -INFINITY : (c[i - 1] + c[i]) / 2;
      const double hi = i == n - 1 ? INFINITY : (c[i] + c[i + 1]) / 2;
      const double p = cdf(hi) - cdf(lo);
      const double m = (std::isinf(lo) ? 0 : pdf(lo)) - (std::isinf(hi) ? 0 : pdf(hi));
      nc[i] = m / p;
    }
    c = nc;
  }
  return c;
}

TEST(Codebook, LevelsAreTheLloydMaxFixedPoint) {
  for (int bits = 1; bits <= 4; ++bits) {
    const auto levels = gaussian_codebook(bits);
    const auto expect = lloyd_max(bits);
    ASSERT_EQ(levels.size(), expect.size());
    for (size_t i = 0; i < levels.size(); ++i) EXPECT_NEAR(levels[i], expect[i], 2e-6) << bits << ":" << i;
    for (size_t i = 0; i < levels.size(); ++i) EXPECT_FLOAT_EQ(levels[i], -levels[levels.size() - 1 - i]);
    for (size_t i = 1; i < levels.size(); ++i) EXPECT_LT(levels[i - 1], levels[i]);
  }
  EXPECT_NEAR(gaussian_codebook(1)[1], std::sqrt(2 / M_PI), 1e-6);
  EXPECT_TRUE(gaussian_codebook(0).empty());
  EXPECT_TRUE(gaussian_codebook(5).empty());
}

TEST(Codebook, NearestLevelIsNearest) {
  for (int bits = 1; bits <= 4; ++bits) {
    const auto levels = gaussian_codebook(bits);
    for (float x = -4.0f; x <= 4.0f; x += 0.01f) {
      const uint8_t code = nearest_level(levels, x);
      for (size_t i = 0; i < levels.size(); ++i)
        ASSERT_LE(std::fabs(x - levels[code]), std::fabs(x - levels[i]) + 1e-7f) << bits << " " << x;
    }
  }
  // Exactly between two levels: the lower index.
  const auto l2 = gaussian_codebook(2);
  EXPECT_EQ(nearest_level(l2, 0.0f), 1);
}

}  // namespace
}  // namespace anchorkv::core
