#include "compress/utility.h"

#include <gtest/gtest.h>

#include <cmath>

#include "compress/anchors.h"
#include "compress/assignment.h"
#include "core/rng.h"

namespace anchorkv::compress {
namespace {

// An observation row: the query and how many positions it sees.
using ObsRow = std::pair<const float*, int64_t>;

std::vector<ObsRow> proxy_rows(const std::vector<float>& K, int64_t S, int64_t D, int64_t window) {
  const int64_t m = window == 0 ? S : std::min(window, S);
  std::vector<ObsRow> rows;
  for (int64_t w = 0; w < m; ++w) rows.emplace_back(&K[(S - m + w) * D], S);
  return rows;
}

// Eq. 6 written out independently, in double, straight from the spec.
void eq6(const std::vector<ObsRow>& rows, const std::vector<float>& K, const std::vector<float>& V, int64_t /*S*/,
         int64_t D, const std::vector<int32_t>& anchors, const SideAssignment& ak, const SideAssignment& av,
         int64_t t, double* uk, double* uv) {
  const int64_t m = static_cast<int64_t>(rows.size());
  double sum_k = 0, sum_a2 = 0;
  for (const auto& [q, n] : rows) {
    std::vector<double> logit(n);
    double mx = -1e300;
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(q[d]) * K[j * D + d];
      logit[j] = s / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, logit[j]);
    }
    double z = 0;
    for (auto& l : logit) z += std::exp(l - mx);
    std::vector<double> y(D, 0.0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < D; ++d) y[d] += std::exp(logit[j] - mx) / z * V[j * D + d];
    const double alpha = t < n ? std::exp(logit[t] - mx) / z : 0.0;
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
    const Observers o = proxy_observers(K.data(), S, D, window);
    const Observation obs = observe_reference(o, K.data(), V.data(), S, D);
    EXPECT_EQ(obs.m, n_proxy_queries(S, window));
    for (int64_t w = 0; w < obs.m; ++w) {
      double s = 0;
      for (int64_t t = 0; t < S; ++t) s += obs.alpha[w * S + t];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
    const auto tk = anchor_table(K.data(), D, anchors, nullptr, 0), tv = anchor_table(V.data(), D, anchors, nullptr, 0);
    const Utilities u = utilities_reference(o, K.data(), V.data(), S, D, obs, anchors, tk.data(), ak.anchor.data(),
                                            ak.coef.data(), tv.data(), av.anchor.data(), av.coef.data());
    for (int64_t t = 0; t < S; ++t) {
      if (t == 2 || t == 11) {
        EXPECT_EQ(u.key[t], -INFINITY);
        EXPECT_EQ(u.value[t], -INFINITY);
        continue;
      }
      double uk, uv;
      eq6(proxy_rows(K, S, D, window), K, V, S, D, anchors, ak, av, t, &uk, &uv);
      EXPECT_NEAR(u.key[t], uk, 1e-4 * std::fabs(uk) + 1e-9) << "window " << window << " t " << t;
      EXPECT_NEAR(u.value[t], uv, 1e-4 * std::fabs(uv) + 1e-9) << "window " << window << " t " << t;
    }
  }
}

// Real queries ([G, W, D]) see positions up to their own: row j sits at S - W + j % W.
TEST(Utility, RealQueriesAreCausalAndMatchEquationSix) {
  const int64_t S = 12, D = 8, G = 2, W = 3;
  core::Rng rng(5);
  std::vector<float> K(S * D), V(S * D), Q(G * W * D);
  for (auto& x : K) x = static_cast<float>(rng.uniform() * 4 - 2);
  for (auto& x : V) x = static_cast<float>(rng.uniform() * 2 - 1);
  for (auto& x : Q) x = static_cast<float>(rng.uniform() * 4 - 2);
  const std::vector<int32_t> anchors = {3, 11};
  const auto ak = assign_reference(K.data(), S, D, anchors);
  const auto av = assign_reference(V.data(), S, D, anchors);
  const Observers o = query_observers(Q.data(), G, W);
  const Observation obs = observe_reference(o, K.data(), V.data(), S, D);
  ASSERT_EQ(obs.m, G * W);
  std::vector<ObsRow> rows;
  for (int64_t j = 0; j < G * W; ++j) {
    const int64_t pos = S - W + j % W;
    rows.emplace_back(&Q[j * D], pos + 1);
    double sum = 0;
    for (int64_t t = 0; t < S; ++t) {
      if (t > pos) {
        EXPECT_EQ(obs.alpha[j * S + t], 0.0f) << "row " << j << " sees position " << t;
      }
      sum += obs.alpha[j * S + t];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  const auto tk = anchor_table(K.data(), D, anchors, nullptr, 0), tv = anchor_table(V.data(), D, anchors, nullptr, 0);
  const Utilities u = utilities_reference(o, K.data(), V.data(), S, D, obs, anchors, tk.data(), ak.anchor.data(),
                                          ak.coef.data(), tv.data(), av.anchor.data(), av.coef.data());
  for (int64_t t = 0; t < S; ++t) {
    if (t == 3 || t == 11) continue;
    double uk, uv;
    eq6(rows, K, V, S, D, anchors, ak, av, t, &uk, &uv);
    EXPECT_NEAR(u.key[t], uk, 1e-4 * std::fabs(uk) + 1e-9) << "t " << t;
    EXPECT_NEAR(u.value[t], uv, 1e-4 * std::fabs(uv) + 1e-9) << "t " << t;
  }
  // Scores average every real row (not only the last w).
  const auto scores = window_scores(obs, S, 1);
  double s0 = 0;
  for (int64_t j = 0; j < G * W; ++j) s0 += obs.alpha[j * S + 0];
  EXPECT_NEAR(scores[0], s0 / (G * W), 1e-6);
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
