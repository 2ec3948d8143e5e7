// Helpers shared by the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "core/half.h"
#include "core/rng.h"

namespace anchorkv::testing_util {

// Clustered random K/V, [B, H, S, D] f32, values already fp16-representable.
inline std::vector<float> random_kv(int64_t B, int64_t H, int64_t S, int64_t D, uint64_t seed, int64_t clusters = 6) {
  core::Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(B * H * S * D));
  auto g = [&] {
    return std::sqrt(-2.0 * std::log(std::max(rng.uniform(), 1e-300))) * std::cos(6.283185307179586 * rng.uniform());
  };
  for (int64_t row = 0; row < B * H; ++row) {
    std::vector<double> centres(static_cast<size_t>(clusters * D));
    for (auto& c : centres) c = g();
    for (int64_t t = 0; t < S; ++t) {
      const int64_t c = static_cast<int64_t>(rng.below(static_cast<uint64_t>(clusters)));
      const double mag = 0.5 + rng.uniform();
      for (int64_t d = 0; d < D; ++d)
        x[static_cast<size_t>((row * S + t) * D + d)] =
            core::round_to_half(static_cast<float>(mag * centres[c * D + d] + 0.3 * g()));
    }
  }
  return x;
}

// Normalized squared error of y against ref: sum (ref - y)^2 / sum ref^2.
inline double nmse(const std::vector<float>& ref, const std::vector<float>& y) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (ref[i] - y[i]) * (ref[i] - y[i]);
    n += ref[i] * ref[i];
  }
  return e / std::max(n, 1e-30);
}

inline std::vector<uint16_t> bits_of(const Tensor& t) {
  const uint16_t* p = t.data_as<uint16_t>();
  return std::vector<uint16_t>(p, p + t.numel());
}

}  // namespace anchorkv::testing_util
