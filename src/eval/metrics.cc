#include "eval/metrics.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"

namespace anchorkv::eval {

void attention_reference(const float* q, const float* K, const float* V, int64_t S, int64_t D, double* y) {
  std::vector<double> logits(static_cast<size_t>(S));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double mx = -INFINITY;
  for (int64_t t = 0; t < S; ++t) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(q[d]) * K[t * D + d];
    logits[t] = s * scale;
    mx = std::max(mx, logits[t]);
  }
  double sum = 0;
  for (auto& l : logits) sum += (l = std::exp(l - mx));
  std::fill_n(y, D, 0.0);
  for (int64_t t = 0; t < S; ++t) {
    const double p = logits[t] / sum;
    for (int64_t d = 0; d < D; ++d) y[d] += p * V[t * D + d];
  }
}

ErrorSummary attention_error(const float* Q, int64_t nq, const float* K, const float* V, const float* Kh,
                             const float* Vh, int64_t rows, int64_t S, int64_t D, int threads, int64_t S_hat) {
  if (S_hat < 0) S_hat = S;
  const int64_t n = rows * nq;
  std::vector<double> rel(static_cast<size_t>(n)), cosine(static_cast<size_t>(n)), num(static_cast<size_t>(n)),
      den(static_cast<size_t>(n));
  core::parallel_for(n, threads, [&](int64_t i) {
    const int64_t row = i / nq;
    std::vector<double> y(static_cast<size_t>(D)), yh(static_cast<size_t>(D));
    const float* q = Q + i * D;
    attention_reference(q, K + row * S * D, V + row * S * D, S, D, y.data());
    attention_reference(q, Kh + row * S_hat * D, Vh + row * S_hat * D, S_hat, D, yh.data());
    double e = 0, yy = 0, hh = 0, yhd = 0;
    for (int64_t d = 0; d < D; ++d) {
      e += (y[d] - yh[d]) * (y[d] - yh[d]);
      yy += y[d] * y[d];
      hh += yh[d] * yh[d];
      yhd += y[d] * yh[d];
    }
    num[i] = e;
    den[i] = yy;
    rel[i] = yy > 0 ? std::sqrt(e / yy) : std::sqrt(e);
    cosine[i] = (yy > 0 && hh > 0) ? yhd / std::sqrt(yy * hh) : 1.0;
  });
  ErrorSummary s;
  s.queries = n;
  if (n == 0) return s;
  double sn = 0, sd = 0, sc = 0, sr = 0;
  for (int64_t i = 0; i < n; ++i) {
    sn += num[i];
    sd += den[i];
    sc += cosine[i];
    sr += rel[i];
  }
  s.mean = sr / static_cast<double>(n);
  s.mean_cosine = sc / static_cast<double>(n);
  s.aggregate = sd > 0 ? std::sqrt(sn / sd) : 0;
  std::vector<double> sorted = rel;
  std::sort(sorted.begin(), sorted.end());
  s.max = sorted.back();
  s.p95 = sorted[static_cast<size_t>(std::min<int64_t>(n - 1, static_cast<int64_t>(std::ceil(0.95 * static_cast<double>(n))) - 1))];
  return s;
}

}  // namespace anchorkv::eval
