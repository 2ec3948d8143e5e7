#include "compress/utility.h"

#include <cmath>
#include <limits>

#include "compress/anchors.h"
#include "compress/assignment.h"
#include "core/linalg.h"
#include "core/softmax.h"

namespace anchorkv::compress {

Observers proxy_observers(const float* K, int64_t S, int64_t D, int64_t window) {
  const int64_t m = n_proxy_queries(S, window);
  return {K + (S - m) * D, m, 0};
}

Observers query_observers(const float* Q, int64_t G, int64_t W, bool after) { return {Q, G * W, W, after}; }

Observation observe_reference(const Observers& o, const float* K, const float* V, int64_t S, int64_t D) {
  Observation obs;
  obs.m = o.m;
  obs.real = o.real();
  const int64_t m = obs.m;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  obs.alpha.assign(static_cast<size_t>(m * S), 0.0f);
  obs.y.assign(static_cast<size_t>(m * D), 0.0f);
  for (int64_t w = 0; w < m; ++w) {
    const float* q = o.rows + w * D;
    const int64_t n = o.visible(w, S);
    float* row = &obs.alpha[static_cast<size_t>(w * S)];
    for (int64_t t = 0; t < n; ++t) row[t] = core::dot_ref(q, K + t * D, D) * inv_sqrt_d;
    core::softmax_inplace(row, n);
    float* y = &obs.y[static_cast<size_t>(w * D)];
    for (int64_t t = 0; t < n; ++t) core::axpy_ref(row[t], V + t * D, y, D);
  }
  return obs;
}

std::vector<float> window_scores(const Observation& obs, int64_t S, int64_t w) {
  std::vector<float> scores(static_cast<size_t>(S), 0.0f);
  if (w <= 0) return scores;
  const int64_t first = obs.real ? 0 : obs.m - w, n = obs.m - first;
  for (int64_t t = 0; t < S; ++t) {
    double s = 0;
    for (int64_t i = first; i < obs.m; ++i) s += obs.alpha[static_cast<size_t>(i * S + t)];
    scores[t] = static_cast<float>(s / static_cast<double>(n));
  }
  return scores;
}

double key_utility(const float* alpha, const float* qr, const float* dist, int64_t m, int64_t stride) {
  double u = 0;
  for (int64_t w = 0; w < m; ++w) {
    const double a = alpha[w * stride], q = qr[w * stride];
    u += a * a * q * q * static_cast<double>(dist[w * stride]);
  }
  return u / static_cast<double>(m);
}

double value_weight(const float* alpha, int64_t m, int64_t stride) {
  double u = 0;
  for (int64_t w = 0; w < m; ++w) {
    const double a = alpha[w * stride];
    u += a * a;
  }
  return u / static_cast<double>(m);
}

Utilities utilities_reference(const Observers& o, const float* K, const float* V, int64_t S, int64_t D,
                              const Observation& obs,
                              std::span<const int32_t> anchors, const float* table_k, const int32_t* assign_k,
                              const float* coef_k, const float* table_v, const int32_t* assign_v,
                              const float* coef_v) {
  const int64_t m = obs.m;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  Utilities u;
  u.key.assign(static_cast<size_t>(S), -std::numeric_limits<float>::infinity());
  u.value.assign(static_cast<size_t>(S), -std::numeric_limits<float>::infinity());
  std::vector<float> r(static_cast<size_t>(D)), diff(static_cast<size_t>(D));
  std::vector<float> qr(static_cast<size_t>(m)), dist(static_cast<size_t>(m)), al(static_cast<size_t>(m));
  size_t next_anchor = 0;
  for (int64_t t = 0; t < S; ++t) {
    if (next_anchor < anchors.size() && anchors[next_anchor] == t) {
      ++next_anchor;
      continue;
    }
    const float* vt = V + t * D;
    residual(K + t * D, table_k + assign_k[t] * D, coef_k[t], D, r.data());
    for (int64_t w = 0; w < m; ++w) {
      al[w] = obs.alpha[static_cast<size_t>(w * S + t)];
      qr[w] = core::dot_ref(o.rows + w * D, r.data(), D) * inv_sqrt_d;
      const float* y = &obs.y[static_cast<size_t>(w * D)];
      for (int64_t d = 0; d < D; ++d) diff[d] = vt[d] - y[d];
      dist[w] = core::dot_ref(diff.data(), diff.data(), D);
    }
    u.key[t] = static_cast<float>(key_utility(al.data(), qr.data(), dist.data(), m, 1));
    residual(vt, table_v + assign_v[t] * D, coef_v[t], D, r.data());
    u.value[t] = static_cast<float>(value_weight(al.data(), m, 1) * core::dot_ref(r.data(), r.data(), D));
  }
  return u;
}

}  // namespace anchorkv::compress
