// Observation window and residual utilities (docs/spec.md §4.3, paper Eq. 6).
//
// m observation queries q_w: the trailing m keys (the seed's proxies, see
// n_proxy_queries) or, when the caller has them, the real queries of the
// segment's last W positions (all G query heads of the row's GQA group),
// alpha = softmax(q_w K^T / sqrt(D)) over the positions q_w sees (all S for
// proxies, as the seed; causally for real queries), y_w = sum_t alpha_wt V_t,
//   u_K(t) = mean_w [ alpha_wt^2 * (q_w . r^K_t / sqrt(D))^2 * ||V_t - y_w||^2 ]
//   u_V(t) = mean_w [ alpha_wt^2 ] * ||r^V_t||^2
// Anchors get -inf (never a residual).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace anchorkv::compress {

// The rows that observe a segment. Proxies: the trailing m keys, each seeing
// all S positions. Real queries: m = G * W rows ([G, W, D]), row j sitting at
// position S - W + j % W and seeing positions up to its own, or (after) past
// the segment, seeing all of it.
struct Observers {
  const float* rows = nullptr;  // [m, D]
  int64_t m = 0;
  int64_t W = 0;  // 0 for proxies
  bool after = false;  // real queries at positions after the segment's (they see all of it)
  bool real() const { return W > 0; }
  // Positions row j sees: [0, visible(j, S)).
  int64_t visible(int64_t j, int64_t S) const { return W > 0 && !after ? S - W + j % W + 1 : S; }
};
Observers proxy_observers(const float* K, int64_t S, int64_t D, int64_t window);
Observers query_observers(const float* Q, int64_t G, int64_t W, bool after = false);

struct Observation {
  int64_t m = 0;
  bool real = false;
  std::vector<float> alpha;  // [m, S]
  std::vector<float> y;      // [m, D]
};

Observation observe_reference(const Observers& o, const float* K, const float* V, int64_t S, int64_t D);

// Selection score per position: the mean of alpha over the last w proxy rows
// (the seed), or over every real query row.
std::vector<float> window_scores(const Observation& obs, int64_t S, int64_t w);

// Combine per-query terms into u_K for one token:
//   alpha[w], qr[w] = q_w . r / sqrt(D), dist[w] = ||V_t - y_w||^2, strided by `stride`.
double key_utility(const float* alpha, const float* qr, const float* dist, int64_t m, int64_t stride);
double value_weight(const float* alpha, int64_t m, int64_t stride);  // mean_w alpha^2

struct Utilities {
  std::vector<float> key;    // [S]
  std::vector<float> value;  // [S]
};

Utilities utilities_reference(const Observers& o, const float* K, const float* V, int64_t S, int64_t D,
                              const Observation& obs,
                              std::span<const int32_t> anchors, const float* table_k, const int32_t* assign_k,
                              const float* coef_k, const float* table_v, const int32_t* assign_v,
                              const float* coef_v);

}  // namespace anchorkv::compress
