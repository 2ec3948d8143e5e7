// The project's own seeded generator, identical on every platform and thread
// count: xoshiro256** (Blackman & Vigna) seeded through SplitMix64.
//
//   Rng(seed): state[i] = splitmix64 outputs 1..4 starting from `seed`.
//   next():    xoshiro256** step, 64 bits.
//   below(n):  uniform integer in [0, n): Lemire's multiply-shift with rejection
//              (unbiased, uses only integer arithmetic).
//   uniform(): double in [0, 1) from the top 53 bits.
//
// Streams for independent work items are derived with stream_seed(seed, i),
// so the picks never depend on which thread runs which item.
#pragma once

#include <cstdint>
#include <vector>

namespace anchorkv::core {

uint64_t splitmix64(uint64_t& state);
// A seed for the i-th independent stream of `seed`.
uint64_t stream_seed(uint64_t seed, uint64_t stream);

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  uint64_t below(uint64_t n);  // n >= 1
  double uniform();

 private:
  uint64_t s_[4];
};

// `count` distinct items drawn uniformly without replacement from `pool`
// (partial Fisher-Yates over a copy of the pool); order of the draw.
std::vector<int32_t> sample_without_replacement(std::vector<int32_t> pool, int64_t count, Rng& rng);

}  // namespace anchorkv::core
