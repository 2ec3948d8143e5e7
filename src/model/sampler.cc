#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace anchorkv::model {

std::vector<double> log_softmax(const float* logits, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - lse;
  return out;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (o_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  int64_t n = o_.top_k > 0 ? std::min(o_.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(n));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (p[i] = std::exp((logits[idx[i]] - mx) / o_.temperature));
  double cum = 0;
  int64_t keep = n;
  for (int64_t i = 0; i < n; ++i) {
    cum += p[i] / sum;
    if (cum >= o_.top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  double r = rng_.uniform() * total;
  for (int64_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace anchorkv::model
