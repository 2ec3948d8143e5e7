// Observation window and residual utilities (docs/spec.md §4.3, paper Eq. 6).
//
// m proxy queries q_w = the trailing m keys (see n_proxy_queries),
// alpha = softmax(q_w K^T / sqrt(D)) over all S positions, y_w = sum_t alpha_wt V_t,
//   u_K(t) = mean_w [ alpha_wt^2 * (q_w . r^K_t / sqrt(D))^2 * ||V_t - y_w||^2 ]
//   u_V(t) = mean_w [ alpha_wt^2 ] * ||r^V_t||^2
// Anchors get -inf (never a residual).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace anchorkv::compress {

struct Observation {
  int64_t m = 0;
  std::vector<float> alpha;  // [m, S]
  std::vector<float> y;      // [m, D]
};

Observation observe_reference(const float* K, const float* V, int64_t S, int64_t D, int64_t window);

// Mean over the last w proxy rows of alpha, per position (selection score).
std::vector<float> window_scores(const Observation& obs, int64_t S, int64_t w);

// Combine per-query terms into u_K for one token:
//   alpha[w], qr[w] = q_w . r / sqrt(D), dist[w] = ||V_t - y_w||^2, strided by `stride`.
double key_utility(const float* alpha, const float* qr, const float* dist, int64_t m, int64_t stride);
double value_weight(const float* alpha, int64_t m, int64_t stride);  // mean_w alpha^2

struct Utilities {
  std::vector<float> key;    // [S]
  std::vector<float> value;  // [S]
};

Utilities utilities_reference(const float* K, const float* V, int64_t S, int64_t D, const Observation& obs,
                              std::span<const int32_t> anchors, const int32_t* assign_k,
                              const float* coef_k, const int32_t* assign_v, const float* coef_v);

}  // namespace anchorkv::compress
