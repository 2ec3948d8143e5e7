#include "core/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

namespace anchorkv::core {
namespace {

constexpr float kOrthoTol = 2e-5f;  // |R^T R - I| entries, float rounding

class RotationDims : public ::testing::TestWithParam<int64_t> {};

TEST_P(RotationDims, IsOrthogonalAndInvertible) {
  const int64_t D = GetParam();
  Rotation R(D, 42);
  EXPECT_EQ(R.is_hadamard(), is_power_of_two(D));
  // Columns R e_i; their Gram matrix must be the identity.
  std::vector<float> cols(static_cast<size_t>(D * D));
  std::vector<float> e(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) {
    std::fill(e.begin(), e.end(), 0.0f);
    e[i] = 1;
    R.forward(e.data(), &cols[i * D]);
  }
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) {
      double g = 0;
      for (int64_t t = 0; t < D; ++t) g += static_cast<double>(cols[i * D + t]) * cols[j * D + t];
      ASSERT_NEAR(g, i == j ? 1.0 : 0.0, kOrthoTol) << i << "," << j;
    }
  Rng rng(1);
  std::vector<float> x(static_cast<size_t>(D)), y(x.size()), z(x.size());
  for (auto& v : x) v = static_cast<float>(rng.uniform() * 2 - 1);
  R.forward(x.data(), y.data());
  R.inverse(y.data(), z.data());
  double nx = 0, ny = 0;
  for (int64_t i = 0; i < D; ++i) {
    EXPECT_NEAR(z[i], x[i], 1e-5);
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
  // In place works too.
  std::vector<float> w = x;
  R.forward(w.data(), w.data());
  for (int64_t i = 0; i < D; ++i) EXPECT_FLOAT_EQ(w[i], y[i]);
}

INSTANTIATE_TEST_SUITE_P(Dims, RotationDims, ::testing::Values(1, 2, 8, 17, 64, 80, 96, 128, 256));

TEST(Rotation, SeededAndDeterministic) {
  for (int64_t D : {64, 80}) {
    Rotation a(D, 42), b(D, 42), c(D, 43);
    std::vector<float> x(static_cast<size_t>(D), 0.0f), ya(x.size()), yb(x.size()), yc(x.size());
    x[0] = 1;
    x[D - 1] = -2;
    a.forward(x.data(), ya.data());
    b.forward(x.data(), yb.data());
    c.forward(x.data(), yc.data());
    EXPECT_EQ(ya, yb);
    EXPECT_NE(ya, yc);
  }
}

TEST(Rotation, HadamardFormMatchesDefinition) {
  // R = H diag(s) / sqrt(D): R e_0 = s_0 * (1, 1, ..., 1) / sqrt(D).
  const int64_t D = 16;
  Rotation R(D, 7);
  std::vector<float> e(D, 0.0f), y(D);
  e[0] = 1;
  R.forward(e.data(), y.data());
  for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(std::fabs(y[i]), 0.25f, 1e-7);
  for (int64_t i = 1; i < D; ++i) EXPECT_EQ(y[i], y[0]);
}

TEST(Rotation, FwhtKnownVector) {
  float x[4] = {1, 2, 3, 4};
  fwht(x, 4);
  EXPECT_FLOAT_EQ(x[0], 10);
  EXPECT_FLOAT_EQ(x[1], -2);
  EXPECT_FLOAT_EQ(x[2], -4);
  EXPECT_FLOAT_EQ(x[3], 0);
}

TEST(Rotation, SpreadsAnOutlier) {
  // The codec rotates so one large coordinate does not dominate the scale.
  for (int64_t D : {64, 80}) {
    Rotation R(D, 42);
    std::vector<float> x(static_cast<size_t>(D), 0.0f), y(x.size());
    x[5] = 100.0f;
    R.forward(x.data(), y.data());
    float mx = 0;
    for (float v : y) mx = std::max(mx, std::fabs(v));
    EXPECT_LT(mx, 100.0f * 0.5f) << D;
  }
}

// The SIMD transform (every in-vector and cross-vector stage) gives the scalar
// transform's bits for every power-of-two size.
TEST(Rotation, SimdFwhtMatchesScalarBitForBit) {
  Rng rng(7);
  for (int64_t n = 1; n <= 1024; n *= 2) {
    std::vector<float> a(static_cast<size_t>(n)), b;
    for (auto& v : a) v = static_cast<float>(rng.uniform() * 2 - 1) * 1e3f;
    b = a;
    fwht(a.data(), n);
    fwht_ref(b.data(), n);
    ASSERT_EQ(a, b) << "n=" << n;
  }
}

}  // namespace
}  // namespace anchorkv::core
