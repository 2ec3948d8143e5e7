#include "anchorkv/baselines.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cache/input.h"
#include "compress/utility.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "core/linalg.h"

namespace anchorkv {

// ============================================================== quantized

struct QuantizedKVCache::Impl {
  int bits;
  int64_t group;
  bool has_shape = false;
  int64_t B = 0, H = 0, D = 0, tokens = 0;
  // Per row and side: codes [n, ceil(D*bits/8)], params [n, groups, 2] fp16 (scale, bias).
  std::vector<std::vector<uint8_t>> codes_k, codes_v;
  std::vector<std::vector<uint16_t>> params_k, params_v;
  int64_t groups() const { return (D + group - 1) / group; }
  int64_t code_bytes() const { return (D * bits + 7) / 8; }
};

int64_t QuantizedKVCache::token_side_bytes(int64_t D, int bits, int64_t group_size) {
  return (D * bits + 7) / 8 + 4 * ((D + group_size - 1) / group_size);
}

QuantizedKVCache::QuantizedKVCache(int bits, int64_t group_size) : impl_(std::make_unique<Impl>()) {
  if (bits != 2 && bits != 4 && bits != 8)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::QuantizedKVCache", "invalid bits: must be 2, 4 or 8, got " + std::to_string(bits));
  if (group_size < 1)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::QuantizedKVCache", "invalid group_size: must be >= 1");
  impl_->bits = bits;
  impl_->group = group_size;
}
QuantizedKVCache::~QuantizedKVCache() = default;

std::string QuantizedKVCache::name() const { return "quantized" + std::to_string(impl_->bits); }

namespace {
// Quantize one [D] vector: per group fp16 scale and bias, codes packed LSB first.
void quantize_token(const float* x, int64_t D, int bits, int64_t group, uint8_t* codes, uint16_t* params) {
  const int levels = (1 << bits) - 1;
  std::fill_n(codes, (D * bits + 7) / 8, uint8_t{0});
  for (int64_t g0 = 0, gi = 0; g0 < D; g0 += group, ++gi) {
    const int64_t g1 = std::min(D, g0 + group);
    float lo = x[g0], hi = x[g0];
    for (int64_t d = g0; d < g1; ++d) {
      lo = std::min(lo, x[d]);
      hi = std::max(hi, x[d]);
    }
    const uint16_t scale16 = core::float_to_half((hi - lo) / static_cast<float>(levels));
    const uint16_t bias16 = core::float_to_half(lo);
    params[2 * gi] = scale16;
    params[2 * gi + 1] = bias16;
    const float scale = core::half_to_float(scale16), bias = core::half_to_float(bias16);
    for (int64_t d = g0; d < g1; ++d) {
      int q = scale > 0 ? static_cast<int>(std::lround((x[d] - bias) / scale)) : 0;
      q = std::clamp(q, 0, levels);
      const int64_t bit = d * bits;
      codes[bit >> 3] |= static_cast<uint8_t>(q << (bit & 7));  // bits divide 8: no straddling
    }
  }
}

void dequantize_token(const uint8_t* codes, const uint16_t* params, int64_t D, int bits, int64_t group, uint16_t* out) {
  const int mask = (1 << bits) - 1;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t gi = d / group, bit = d * bits;
    const int q = (codes[bit >> 3] >> (bit & 7)) & mask;
    out[d] = core::float_to_half(core::half_to_float(params[2 * gi]) * static_cast<float>(q) +
                                 core::half_to_float(params[2 * gi + 1]));
  }
}
}  // namespace

KVPair QuantizedKVCache::update_and_fetch(const TensorView& keys, const TensorView& values) {
  Impl& s = *impl_;
  const cache::StagedInput in =
      cache::stage_input("anchorkv::QuantizedKVCache::update_and_fetch", keys, values, s.has_shape, s.B, s.H, s.D);
  if (!s.has_shape) {
    s.has_shape = true;
    s.B = in.B();
    s.H = in.H();
    s.D = in.D();
    s.codes_k.resize(static_cast<size_t>(s.B * s.H));
    s.codes_v.resize(s.codes_k.size());
    s.params_k.resize(s.codes_k.size());
    s.params_v.resize(s.codes_k.size());
  }
  const int64_t S = in.S(), D = s.D, cb = s.code_bytes(), np = 2 * s.groups();
  for (int64_t r = 0; r < s.B * s.H; ++r) {
    for (int side = 0; side < 2; ++side) {
      auto& codes = side == 0 ? s.codes_k[r] : s.codes_v[r];
      auto& params = side == 0 ? s.params_k[r] : s.params_v[r];
      const float* x = side == 0 ? in.key_row(r) : in.value_row(r);
      const size_t c0 = codes.size(), p0 = params.size();
      codes.resize(c0 + static_cast<size_t>(S * cb));
      params.resize(p0 + static_cast<size_t>(S * np));
      for (int64_t t = 0; t < S; ++t)
        quantize_token(x + t * D, D, s.bits, s.group, &codes[c0 + t * cb], &params[p0 + t * np]);
    }
  }
  s.tokens += S;
  return fetch();
}

KVPair QuantizedKVCache::fetch() const {
  const Impl& s = *impl_;
  const int64_t n = s.tokens, D = s.D, cb = s.code_bytes(), np = 2 * s.groups();
  KVPair out{Tensor(DType::kF16, {s.B, s.H, n, D}), Tensor(DType::kF16, {s.B, s.H, n, D})};
  for (int64_t r = 0; r < s.B * s.H; ++r)
    for (int64_t t = 0; t < n; ++t) {
      dequantize_token(&s.codes_k[r][t * cb], &s.params_k[r][t * np], D, s.bits, s.group,
                       out.keys.data_as<uint16_t>() + (r * n + t) * D);
      dequantize_token(&s.codes_v[r][t * cb], &s.params_v[r][t * np], D, s.bits, s.group,
                       out.values.data_as<uint16_t>() + (r * n + t) * D);
    }
  return out;
}

int64_t QuantizedKVCache::offset() const { return impl_->tokens; }
int64_t QuantizedKVCache::nbytes() const {
  int64_t n = 0;
  for (size_t r = 0; r < impl_->codes_k.size(); ++r)
    n += static_cast<int64_t>(impl_->codes_k[r].size() + impl_->codes_v[r].size() +
                              2 * (impl_->params_k[r].size() + impl_->params_v[r].size()));
  return n;
}
int64_t QuantizedKVCache::full_seq_bytes() const { return impl_->tokens * impl_->B * impl_->H * impl_->D * 4; }
int64_t QuantizedKVCache::tokens_total() const { return impl_->tokens * impl_->B * impl_->H; }

// ============================================================== eviction base

struct EvictionCacheBase::Impl {
  double theta;
  const char* op;
  bool has_shape = false, selected = false;
  int64_t B = 0, H = 0, D = 0;
  int64_t seen = 0;       // positions per row seen
  int64_t capacity = 0;   // kept tokens per row after the prefill (rolling caches hold it)
  cache::ExactRows kept;  // rows x [kept, D] fp16
};

EvictionCacheBase::EvictionCacheBase(double theta, const char* op) : impl_(std::make_unique<Impl>()) {
  if (!std::isfinite(theta) || theta < 0.0 || theta > 1.0)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid theta: must be in [0, 1], got " + std::to_string(theta));
  impl_->theta = theta;
  impl_->op = op;
}
EvictionCacheBase::~EvictionCacheBase() = default;

double EvictionCacheBase::theta() const { return impl_->theta; }
int64_t EvictionCacheBase::budget_tokens(int64_t S) const {
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor(impl_->theta * static_cast<double>(S))), 1, S);
}

KVPair EvictionCacheBase::update_and_fetch(const TensorView& keys, const TensorView& values) {
  Impl& s = *impl_;
  const std::string op = std::string(s.op) + "::update_and_fetch";
  const cache::StagedInput in = cache::stage_input(op, keys, values, s.has_shape, s.B, s.H, s.D);
  const int64_t S = in.S(), D = in.D(), R = in.B() * in.H();
  if (!s.selected && S > 1) {
    // Prefill: keep the selected positions of this call (after anything stored before).
    const int64_t budget = budget_tokens(S);
    std::vector<std::vector<int32_t>> keep(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) keep[r] = select(in.key_row(r), S, D, budget);
    cache::ExactRows rows = s.kept;
    rows.resize_rows(R);
    for (int64_t r = 0; r < R; ++r) {
      const size_t at = rows.k[r].size();
      rows.k[r].resize(at + keep[r].size() * static_cast<size_t>(D));
      rows.v[r].resize(rows.k[r].size());
      for (size_t i = 0; i < keep[r].size(); ++i) {
        core::f32_to_f16_n(in.key_row(r) + keep[r][i] * D, &rows.k[r][at + i * D], D);
        core::f32_to_f16_n(in.value_row(r) + keep[r][i] * D, &rows.v[r][at + i * D], D);
      }
    }
    rows.tokens += static_cast<int64_t>(keep[0].size());
    s.kept = std::move(rows);
    s.selected = true;
    s.capacity = s.kept.tokens;
  } else {
    s.kept.append(in);
    if (s.selected && rolling() && s.kept.tokens > s.capacity) {
      // Evict the oldest tokens after the sinks.
      const int64_t excess = s.kept.tokens - s.capacity, sk = std::min(sinks(), s.capacity);
      for (int64_t r = 0; r < R; ++r) {
        s.kept.k[r].erase(s.kept.k[r].begin() + sk * D, s.kept.k[r].begin() + (sk + excess) * D);
        s.kept.v[r].erase(s.kept.v[r].begin() + sk * D, s.kept.v[r].begin() + (sk + excess) * D);
      }
      s.kept.tokens = s.capacity;
    }
  }
  if (!s.has_shape) {
    s.has_shape = true;
    s.B = in.B();
    s.H = in.H();
    s.D = D;
  }
  s.seen += S;
  return fetch();
}

KVPair EvictionCacheBase::fetch() const {
  const Impl& s = *impl_;
  const int64_t n = s.kept.tokens;
  KVPair out{Tensor(DType::kF16, {s.B, s.H, n, s.D}), Tensor(DType::kF16, {s.B, s.H, n, s.D})};
  for (int64_t r = 0; r < s.B * s.H; ++r) {
    std::copy(s.kept.k[r].begin(), s.kept.k[r].end(), out.keys.data_as<uint16_t>() + r * n * s.D);
    std::copy(s.kept.v[r].begin(), s.kept.v[r].end(), out.values.data_as<uint16_t>() + r * n * s.D);
  }
  return out;
}

int64_t EvictionCacheBase::offset() const { return impl_->seen; }
int64_t EvictionCacheBase::nbytes() const { return impl_->kept.buffer_bytes(); }
int64_t EvictionCacheBase::full_seq_bytes() const { return impl_->seen * impl_->B * impl_->H * impl_->D * 4; }
int64_t EvictionCacheBase::tokens_total() const { return impl_->seen * impl_->B * impl_->H; }
int64_t EvictionCacheBase::tokens_kept() const { return impl_->kept.tokens * impl_->B * impl_->H; }

// ============================================================== StreamingLLM

StreamingLLMCache::StreamingLLMCache(double theta, int64_t sinks)
    : EvictionCacheBase(theta, "anchorkv::StreamingLLMCache"), sinks_(sinks) {
  if (sinks < 0) core::fail(ErrorCode::kInvalidConfig, "anchorkv::StreamingLLMCache", "invalid sinks: must be >= 0");
}

std::vector<int32_t> StreamingLLMCache::select(const float*, int64_t S, int64_t, int64_t budget) const {
  const int64_t sk = std::min(sinks_, budget);
  std::vector<int32_t> keep;
  for (int64_t t = 0; t < sk; ++t) keep.push_back(static_cast<int32_t>(t));
  for (int64_t t = std::max(sk, S - (budget - sk)); t < S; ++t) keep.push_back(static_cast<int32_t>(t));
  return keep;
}

// ============================================================== SnapKV

SnapKVCache::SnapKVCache(double theta, int64_t window, int64_t kernel)
    : EvictionCacheBase(theta, "anchorkv::SnapKVCache"), window_(window), kernel_(kernel) {
  if (window < 1) core::fail(ErrorCode::kInvalidConfig, "anchorkv::SnapKVCache", "invalid window: must be >= 1");
  if (kernel < 1 || kernel % 2 == 0)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::SnapKVCache", "invalid kernel: must be odd and >= 1");
}

std::vector<int32_t> SnapKVCache::select(const float* K, int64_t S, int64_t D, int64_t budget) const {
  const int64_t w = std::min({window_, budget, S});
  const int64_t n_cand = S - w;
  // Observation-window attention: the trailing w keys as queries over all S positions.
  std::vector<float> logits(static_cast<size_t>(w * S));
  core::dot_matrix(K + (S - w) * D, w, D, K, S, D, D, logits.data(), S);
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<double> score(static_cast<size_t>(S), 0.0);
  for (int64_t i = 0; i < w; ++i) {
    float* row = &logits[static_cast<size_t>(i * S)];
    for (int64_t t = 0; t < S; ++t) row[t] *= inv;
    compress::softmax_inplace(row, S);
    for (int64_t t = 0; t < S; ++t) score[t] += row[t];
  }
  // Average pooling of width kernel over the candidates (window of valid neighbours).
  const int64_t half = kernel_ / 2;
  std::vector<double> pooled(static_cast<size_t>(n_cand));
  for (int64_t t = 0; t < n_cand; ++t) {
    const int64_t a = std::max<int64_t>(0, t - half), b = std::min(n_cand - 1, t + half);
    double sum = 0;
    for (int64_t j = a; j <= b; ++j) sum += score[j];
    pooled[t] = sum / static_cast<double>(b - a + 1);
  }
  std::vector<int32_t> cand(static_cast<size_t>(n_cand));
  std::iota(cand.begin(), cand.end(), 0);
  const int64_t top = std::min(budget - w, n_cand);
  std::partial_sort(cand.begin(), cand.begin() + top, cand.end(), [&](int32_t a, int32_t b) {
    return pooled[a] != pooled[b] ? pooled[a] > pooled[b] : a < b;
  });
  std::vector<int32_t> keep(cand.begin(), cand.begin() + top);
  for (int64_t t = n_cand; t < S; ++t) keep.push_back(static_cast<int32_t>(t));
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace anchorkv
