#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace anchorkv::model {
namespace {

// The pair index at which a frequency makes `rotations` full turns over the
// original context (llama.cpp's ggml_rope_yarn_corr_dim, in float as there).
float yarn_corr_dim(int64_t D, int64_t original_context, double rotations, double base) {
  return static_cast<float>(D) *
         std::log(static_cast<float>(original_context) /
                  (static_cast<float>(rotations) * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(static_cast<float>(base)));
}

// YaRN's ramp r_i: 1 for the pairs below the low correction dim (high
// frequencies, kept as trained), 0 above the high one (interpolated).
std::vector<double> yarn_ramp(const RopeScaling& s, int64_t D, double base) {
  const float low = std::max(0.0f, std::floor(yarn_corr_dim(D, s.original_context, s.beta_fast, base)));
  const float high =
      std::min(static_cast<float>(D - 1), std::ceil(yarn_corr_dim(D, s.original_context, s.beta_slow, base)));
  std::vector<double> r(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    const float y = (static_cast<float>(i) - low) / std::max(0.001f, high - low);
    r[static_cast<size_t>(i)] = 1.0 - std::min(1.0f, std::max(0.0f, y));
  }
  return r;
}

}  // namespace

std::vector<double> rope_freq_scale(const RopeScaling& s, int64_t D, double base) {
  const int64_t half = D / 2;
  const double interp = s.type == RopeScalingType::kNone || s.factor == 0.0 ? 1.0 : 1.0 / s.factor;
  const std::vector<double> ramp =
      s.type == RopeScalingType::kYarn ? yarn_ramp(s, D, base) : std::vector<double>(static_cast<size_t>(half), 0.0);
  std::vector<double> out(static_cast<size_t>(half));
  bool all_one = true;
  for (int64_t i = 0; i < half; ++i) {
    const auto u = static_cast<size_t>(i);
    double f = interp * (1.0 - ramp[u]) + ramp[u];
    if (!s.freq_factors.empty()) f /= static_cast<double>(s.freq_factors[u]);
    out[u] = f;
    all_one = all_one && f == 1.0;
  }
  if (all_one) out.clear();
  return out;
}

double rope_score_factor(const RopeScaling& s) {
  double mscale = s.attn_factor;
  if (s.type == RopeScalingType::kYarn && s.factor > 1.0) mscale *= 1.0 + 0.1 * std::log(s.factor);
  return mscale * mscale;
}

}  // namespace anchorkv::model
