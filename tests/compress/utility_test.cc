#include "compress/utility.h"

#include <gtest/gtest.h>

#include <cmath>

#include "compress/anchors.h"
#include "compress/assignment.h"
#include "core/rng.h"

namespace anchorkv::compress {
namespace {

// Eq. 6 written out independently, in double, straight from the spec.
void eq6(const std::vector<float>& K, const std::vector<float>& V, int64_t S, int64_t D, int64_t window,
         const std::vector<int32_t>& anchors, const SideAssignment& ak, const SideAssignment& av, int64_t t,
         double* uk, double* uv) {
  const int64_t m = window == 0 ? S : std::min(window, S);
  double sum_k = 0, sum_a2 = 0;
  for (int64_t w = 0; w < m; ++w) {
    const float* q = &K[(S - m + w) * D];
    std::vector<double> logit(S);
    double mx = -1e300;
    for (int64_t j = 0; j < S; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(q[d]) * K[j * D + d];
      logit[j] = s / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, logit[j]);
    }
    double z = 0;
    for (auto& l : logit) z += std::exp(l - mx);
    std::vector<double> y(D, 0.0);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t d = 0; d < D; ++d) y[d] += std::exp(logit[j] - mx) / z * V[j * D + d];
    const double alpha = std::exp(logit[t] - mx) / z;
    double qr = 0, dist = 0;
    const int64_t a = anchors[ak.anchor[t]];
    for (int64_t d = 0; d < D; ++d) {
      qr += q[d] * (K[t * D + d] - static_cast<double>(ak.coef[t]) * K[a * D + d]);
      dist += (V[t * D + d] - y[d]) * (V[t * D + d] - y[d]);
    }
    qr /= std::sqrt(static_cast<double>(D));
    sum_k += alpha * alpha * qr * qr * dist;
    sum_a2 += alpha * alpha;
  }
  double rv2 = 0;
  const int64_t a = anchors[av.anchor[t]];
  for (int64_t d = 0; d < D; ++d) {
    const double r = V[t * D + d] - static_cast<double>(av.coef[t]) * V[a * D + d];
    rv2 += r * r;
  }
  *uk = sum_k / m;
  *uv = sum_a2 / m * rv2;
}

TEST(Utility, MatchesEquationSix) {
  for (int64_t window : {0, 4, 32}) {
    const int64_t S = 12, D = 8;
    core::Rng rng(3);
    std::vector<float> K(S * D), V(S * D);
    for (auto& x : K) x = static_cast<float>(rng.uniform() * 4 - 2);
    for (auto& x : V) x = static_cast<float>(rng.uniform() * 2 - 1);
    const std::vector<int32_t> anchors = {2, 11};
    const auto ak = assign_reference(K.data(), S, D, anchors);
    const auto av = assign_reference(V.data(), S, D, anchors);
    const Observation obs = observe_reference(K.data(), V.data(), S, D, window);
    EXPECT_EQ(obs.m, n_proxy_queries(S, window));
    for (int64_t w = 0; w < obs.m; ++w) {
      double s = 0;
      for (int64_t t = 0; t < S; ++t) s += obs.alpha[w * S + t];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
    const Utilities u = utilities_reference(K.data(), V.data(), S, D, obs, anchors, ak.anchor.data(), ak.coef.data(),
                                            av.anchor.data(), av.coef.data());
    for (int64_t t = 0; t < S; ++t) {
      if (t == 2 || t == 11) {
        EXPECT_EQ(u.key[t], -INFINITY);
        EXPECT_EQ(u.value[t], -INFINITY);
        continue;
      }
      double uk, uv;
      eq6(K, V, S, D, window, anchors, ak, av, t, &uk, &uv);
      EXPECT_NEAR(u.key[t], uk, 1e-4 * std::fabs(uk) + 1e-9) << "window " << window << " t " << t;
      EXPECT_NEAR(u.value[t], uv, 1e-4 * std::fabs(uv) + 1e-9) << "window " << window << " t " << t;
    }
  }
}

TEST(Utility, WindowScoresAverageTheLastRows) {
  Observation obs;
  obs.m = 3;
  obs.alpha = {0.5f, 0.5f, 0.0f,   // row 0 (not in a window of 2)
               0.2f, 0.3f, 0.5f,   // row 1
               0.4f, 0.1f, 0.5f};  // row 2
  const auto s = window_scores(obs, 3, 2);
  EXPECT_NEAR(s[0], 0.3f, 1e-7);
  EXPECT_NEAR(s[1], 0.2f, 1e-7);
  EXPECT_NEAR(s[2], 0.5f, 1e-7);
}

}  // namespace
}  // namespace anchorkv::compress
