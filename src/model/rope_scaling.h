// A model's RoPE scaling as GGUF describes it (`{arch}.rope.scaling.*` keys and
// the `rope_freqs.weight` tensor), turned into what the rest of the project
// takes: per-pair frequency scales (RopeOptions::freq_scale) and a factor on
// the attention scores. The arithmetic is llama.cpp's ggml_rope_ext: pair i's
// angle per position is
//   base^(-2i/D) / freq_factor_i * (s * (1 - r_i) + r_i),   s = 1 / factor,
// with r_i = 0 for linear scaling and YaRN's ramp between its correction dims
// for YaRN, and cos and sin both multiplied by
//   mscale = attn_factor * (YaRN ? 1 + 0.1 ln(factor) : 1),
// so every q.k score is multiplied by mscale^2 (applied to the queries).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anchorkv/config.h"

namespace anchorkv::model {

enum class RopeScalingType : uint8_t { kNone, kLinear, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;            // context extension factor (>= 1 to extend)
  int64_t original_context = 0;   // YaRN: the context the model was trained at before extension
  double attn_factor = 1.0;       // extra magnitude scale on cos/sin (rope.scaling.attn_factor)
  double beta_fast = 32.0, beta_slow = 1.0;  // YaRN correction bounds, in rotations
  std::vector<float> freq_factors;  // rope_freqs.weight: per-pair divisors (empty: none)
};

// The frequency scales of `s` for head dim D (empty when every scale is 1).
std::vector<double> rope_freq_scale(const RopeScaling& s, int64_t D, double base);
// mscale^2: the factor on every attention score.
double rope_score_factor(const RopeScaling& s);

}  // namespace anchorkv::model
