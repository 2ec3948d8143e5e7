// Attention-fidelity metrics (reference math in double).
#pragma once

#include <cstdint>
#include <vector>

namespace anchorkv::eval {

// y = softmax(q K^T / sqrt(D)) V over all S positions; K, V: [S, D]; q, y: [D].
void attention_reference(const float* q, const float* K, const float* V, int64_t S, int64_t D, double* y);

struct ErrorSummary {
  double mean = 0;      // mean of per-query relative errors ||y - y^|| / ||y||
  double p95 = 0;
  double max = 0;
  double aggregate = 0; // sqrt(sum ||y - y^||^2 / sum ||y||^2)
  double mean_cosine = 0;
  int64_t queries = 0;
};

// Queries Q [rows, nq, D] against exact K, V ([rows, S, D]) and approximations
// Kh, Vh ([rows, S_hat, D]; S_hat < S for caches that evict, -1 means S).
ErrorSummary attention_error(const float* Q, int64_t nq, const float* K, const float* V, const float* Kh,
                             const float* Vh, int64_t rows, int64_t S, int64_t D, int threads, int64_t S_hat = -1);

}  // namespace anchorkv::eval
