// Next-token sampling: greedy (temperature 0) or temperature + top-k + top-p
// with the project's seeded generator.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace anchorkv::model {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = all
  float top_p = 1.0f;        // 1 = all
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {}
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplerOptions o_;
  core::Rng rng_;
};

// log softmax of one row (double), for perplexity and KL.
std::vector<double> log_softmax(const float* logits, int64_t n);

}  // namespace anchorkv::model
