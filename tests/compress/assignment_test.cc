#include "compress/assignment.h"

#include <gtest/gtest.h>

namespace anchorkv::compress {
namespace {

TEST(Assignment, HandComputedCases) {
  // D = 2; anchors at positions 0 = (1, 0) and 1 = (0, 1).
  const float X[] = {1, 0,    // anchor 0
                     0, 1,    // anchor 1
                     3, 1,    // most parallel to anchor 0: gamma 3, r = (0, 1)
                     -1, 5,   // anchor 1, gamma 5
                     -2, 0,   // anti-parallel counts (|cos|): anchor 0, gamma -2
                     1, 1,    // tie: lower ordinal
                     0, 0};   // zero vector: anchor 0, gamma 0
  const std::vector<int32_t> anchors = {0, 1};
  const auto a = assign_reference(X, 7, 2, anchors);
  EXPECT_EQ(a.anchor, (std::vector<int32_t>{0, 1, 0, 1, 0, 0, 0}));
  EXPECT_FLOAT_EQ(a.coef[0], 1.0f);
  EXPECT_FLOAT_EQ(a.coef[1], 1.0f);
  EXPECT_FLOAT_EQ(a.coef[2], 3.0f);
  EXPECT_FLOAT_EQ(a.coef[3], 5.0f);
  EXPECT_FLOAT_EQ(a.coef[4], -2.0f);
  EXPECT_FLOAT_EQ(a.coef[5], 1.0f);
  EXPECT_FLOAT_EQ(a.coef[6], 0.0f);
  float r[2];
  residual(&X[4], &X[0], a.coef[2], 2, r);
  EXPECT_FLOAT_EQ(r[0], 0.0f);
  EXPECT_FLOAT_EQ(r[1], 1.0f);
}

TEST(Assignment, ProjectionResidualIsOrthogonalToAnchor) {
  const float X[] = {2, 1, 0, 1, 3, -1, 0.5f, 0.5f, 0.5f};
  const std::vector<int32_t> anchors = {0};
  const auto a = assign_reference(X, 3, 3, anchors);
  for (int t = 1; t < 3; ++t) {
    float r[3];
    residual(&X[t * 3], &X[0], a.coef[t], 3, r);
    EXPECT_NEAR(r[0] * X[0] + r[1] * X[1] + r[2] * X[2], 0.0f, 1e-5f);
  }
}

}  // namespace
}  // namespace anchorkv::compress
