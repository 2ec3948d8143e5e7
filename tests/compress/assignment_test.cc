#include "compress/assignment.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/linalg.h"
#include "core/rng.h"

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

// Anchors whose cosines with the token tie in exact arithmetic (a1 is a0
// mirrored about x) rank by rounding alone: dots summed in another order
// (as the SIMD path's are) still pick the reference's anchor.
TEST(Assignment, NearTiesPickTheReferencesAnchorWhateverTheSummationOrder) {
  constexpr int64_t D = 128;
  core::Rng rng(11);
  auto reversed_dot = [](const float* a, const float* b) {
    float s = 0.0f;
    for (int64_t d = D - 1; d >= 0; --d) s += a[d] * b[d];
    return s;
  };
  int flipped_without_settling = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<float> x(D), table(2 * D);
    for (auto& v : x) v = static_cast<float>(rng.uniform() - 0.5);
    for (int64_t d = 0; d < D; ++d) table[d] = static_cast<float>(rng.uniform() - 0.5);
    const float proj = core::dot_ref(x.data(), table.data(), D) / core::dot_ref(x.data(), x.data(), D);
    for (int64_t d = 0; d < D; ++d) table[D + d] = 2.0f * proj * x[d] - table[d];
    float dots_ref[2], dots_other[2], norms_ref[2], norms_other[2], sq_ref[2], sq_other[2];
    for (int j = 0; j < 2; ++j) {
      const float* a = &table[static_cast<size_t>(j * D)];
      dots_ref[j] = core::dot_ref(x.data(), a, D);
      dots_other[j] = reversed_dot(x.data(), a);
      sq_ref[j] = core::dot_ref(a, a, D);
      sq_other[j] = reversed_dot(a, a);
      norms_ref[j] = std::sqrt(sq_ref[j]);
      norms_other[j] = std::sqrt(sq_other[j]);
    }
    const float xn_ref = std::sqrt(core::dot_ref(x.data(), x.data(), D));
    const float xn_other = std::sqrt(reversed_dot(x.data(), x.data()));
    int32_t ref = -1, other = -1;
    float coef = 0.0f;
    choose_anchor({table.data(), D, 2, norms_ref, sq_ref}, x.data(), dots_ref, xn_ref, &ref, &coef);
    choose_anchor({table.data(), D, 2, norms_other, sq_other}, x.data(), dots_other, xn_other, &other, &coef,
                  true);
    ASSERT_EQ(ref, other) << "trial " << trial;
    int64_t plain = 0;  // the other order's argmax
    core::abs_cosine_near_max_ref(dots_other, 2, xn_other, norms_other, kAssignEps, 0.0f, &plain);
    flipped_without_settling += plain != ref;
  }
  // The case is a real one: ranking the other order's cosines alone disagrees.
  EXPECT_GT(flipped_without_settling, 0);
}

}  // namespace
}  // namespace anchorkv::compress
