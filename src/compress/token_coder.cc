#include "compress/token_coder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace anchorkv::compress {

TokenCoder::TokenCoder(int64_t D, int quarter_bits, uint64_t seed) : D_(D), quarter_bits_(quarter_bits) {
  constexpr const char* op = "anchorkv::TurboQuantCache";
  if (quarter_bits < 4 || quarter_bits > 16)
    core::fail(ErrorCode::kInvalidConfig, op,
               "bits must be 1 to 4 in steps of 0.25, got " + std::to_string(quarter_bits / 4.0));
  if (D < 1) core::fail(ErrorCode::kInvalidConfig, op, "head dim must be >= 1");
  const int narrow = quarter_bits / 4, frac = quarter_bits % 4;
  const int64_t wide = std::clamp<int64_t>(std::llround(static_cast<double>(D) * frac / 4.0), 0, D);
  // Seeds per group: the groups' rotations must differ even at equal sizes.
  if (wide == 0 || wide == D) {
    codecs_.emplace_back(D, wide == D && frac ? narrow + 1 : narrow, ResidualScale::kRms, seed);
  } else {
    codecs_.emplace_back(D - wide, narrow, ResidualScale::kRms, seed);
    codecs_.emplace_back(wide, narrow + 1, ResidualScale::kRms, seed ^ 0x9e3779b97f4a7c15ULL);
  }
}

int64_t TokenCoder::token_bytes() const {
  int64_t n = 0;
  for (const auto& c : codecs_) n += c.code_bytes() + 2;
  return n;
}

void TokenCoder::encode(const float* x, const int32_t* channels, uint8_t* const* codes, uint16_t* scales,
                        float* scratch) const {
  float* gathered = scratch;  // [D], then the codec's 2 * D of scratch
  for (int g = 0; g < groups(); ++g) {
    const int64_t off = offset(g), n = group_dim(g);
    for (int64_t i = 0; i < n; ++i) gathered[i] = x[channels[off + i]];
    codec(g).encode(gathered, codes[g], &scales[g], scratch + D_);
  }
}

void TokenCoder::decode(const uint8_t* const* codes, const uint16_t* scales, const int32_t* channels, float* out,
                        float* scratch) const {
  float* y = scratch;
  auto* bytes = reinterpret_cast<uint8_t*>(scratch + D_);
  for (int g = 0; g < groups(); ++g) {
    const int64_t off = offset(g), n = group_dim(g);
    codec(g).decode(codes[g], scales[g], y, bytes);
    for (int64_t i = 0; i < n; ++i) out[channels[off + i]] = y[i];
  }
}

std::vector<int32_t> choose_wide_channels(const float* x, int64_t n, int64_t D, int64_t wide) {
  std::vector<double> power(static_cast<size_t>(D), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; ++d) power[d] += static_cast<double>(x[t * D + d]) * x[t * D + d];
  std::vector<int32_t> by_power(static_cast<size_t>(D));
  std::iota(by_power.begin(), by_power.end(), 0);
  std::stable_sort(by_power.begin(), by_power.end(), [&](int32_t a, int32_t b) { return power[a] > power[b]; });
  std::vector<bool> is_wide(static_cast<size_t>(D), false);
  for (int64_t i = 0; i < wide; ++i) is_wide[by_power[i]] = true;
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(D));
  for (int pass = 0; pass < 2; ++pass)
    for (int32_t d = 0; d < D; ++d)
      if (is_wide[d] == (pass == 1)) order.push_back(d);
  return order;
}

bool valid_channel_order(const int32_t* channels, int64_t D, int64_t wide) {
  std::vector<bool> seen(static_cast<size_t>(D), false);
  for (int64_t i = 0; i < D; ++i) {
    const int32_t c = channels[i];
    if (c < 0 || c >= D || seen[c]) return false;
    seen[c] = true;
    const bool group_start = i == 0 || i == D - wide;
    if (!group_start && c <= channels[i - 1]) return false;
  }
  return true;
}

}  // namespace anchorkv::compress
