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
#include "core/parallel.h"

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
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::QuantizedKVCache",
               "invalid bits: must be 2, 4 or 8, got " + std::to_string(bits));
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

void dequantize_token(const uint8_t* codes, const uint16_t* params, int64_t D, int bits, int64_t group,
                      uint16_t* out) {
  const int mask = (1 << bits) - 1;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t gi = d / group, bit = d * bits;
    const int q = (codes[bit >> 3] >> (bit & 7)) & mask;
    out[d] = core::float_to_half(core::half_to_float(params[2 * gi]) * static_cast<float>(q) +
                                 core::half_to_float(params[2 * gi + 1]));
  }
}
}  // namespace

void QuantizedKVCache::append(const TensorView& keys, const TensorView& values, const char* method) {
  Impl& s = *impl_;
  const cache::StagedInput in = cache::stage_input(std::string("anchorkv::QuantizedKVCache::") + method, keys,
                                                   values, s.has_shape, s.B, s.H, s.D);
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
int64_t QuantizedKVCache::full_seq_bytes() const {
  return impl_->tokens * impl_->B * impl_->H * impl_->D * 4;
}
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
    core::fail(ErrorCode::kInvalidConfig, op,
               "invalid theta: must be in [0, 1], got " + std::to_string(theta));
  impl_->theta = theta;
  impl_->op = op;
}
EvictionCacheBase::~EvictionCacheBase() = default;

double EvictionCacheBase::theta() const { return impl_->theta; }
int64_t EvictionCacheBase::budget_tokens(int64_t S) const {
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor(impl_->theta * static_cast<double>(S))), 1, S);
}

void EvictionCacheBase::append(const TensorView& keys, const TensorView& values, const char* method) {
  Impl& s = *impl_;
  const std::string op = std::string(s.op) + "::" + method;
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
}

KVPair EvictionCacheBase::fetch() const { return impl_->kept.to_pair(impl_->B, impl_->H, impl_->D); }

int64_t EvictionCacheBase::offset() const { return impl_->seen; }
int64_t EvictionCacheBase::nbytes() const { return impl_->kept.buffer_bytes(); }
int64_t EvictionCacheBase::full_seq_bytes() const { return impl_->seen * impl_->B * impl_->H * impl_->D * 4; }
int64_t EvictionCacheBase::tokens_total() const { return impl_->seen * impl_->B * impl_->H; }
int64_t EvictionCacheBase::tokens_kept() const { return impl_->kept.tokens * impl_->B * impl_->H; }

// ============================================================== StreamingLLM

StreamingLLMCache::StreamingLLMCache(double theta, int64_t sinks)
    : EvictionCacheBase(theta, "anchorkv::StreamingLLMCache"), sinks_(sinks) {
  if (sinks < 0)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::StreamingLLMCache", "invalid sinks: must be >= 0");
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
  if (window < 1)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::SnapKVCache", "invalid window: must be >= 1");
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

namespace anchorkv {

// ============================================================== KIVI

struct KIVICache::Impl {
  int bits;
  int64_t group, residual;
  bool has_shape = false;
  int64_t B = 0, H = 0, D = 0, tokens = 0;
  int64_t quantized = 0;  // tokens per row that left the fp16 window (a multiple of group)
  // Keys: per row, per token group: codes [group, D] packed along the group's
  // tokens per channel, params [D, 2] fp16 (scale, zero).
  std::vector<std::vector<uint8_t>> k_codes;
  std::vector<std::vector<uint16_t>> k_params;
  // Values: per row, per token: codes [D] packed, params [ceil(D/group), 2] fp16.
  std::vector<std::vector<uint8_t>> v_codes;
  std::vector<std::vector<uint16_t>> v_params;
  cache::ExactRows window;  // the fp16 tail, rows x [n, D]
  int64_t k_group_code_bytes() const { return (group * D * bits + 7) / 8; }
  int64_t v_token_code_bytes() const { return (D * bits + 7) / 8; }
  int64_t v_groups() const { return (D + group - 1) / group; }
};

KIVICache::KIVICache(int bits, int64_t group, int64_t residual) : impl_(std::make_unique<Impl>()) {
  constexpr const char* op = "anchorkv::KIVICache";
  if (bits != 2 && bits != 4)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid bits: must be 2 or 4, got " + std::to_string(bits));
  if (group < 1) core::fail(ErrorCode::kInvalidConfig, op, "invalid group: must be >= 1");
  if (residual < 0) core::fail(ErrorCode::kInvalidConfig, op, "invalid residual: must be >= 0");
  impl_->bits = bits;
  impl_->group = group;
  impl_->residual = residual;
}
KIVICache::~KIVICache() = default;
std::string KIVICache::name() const { return "kivi" + std::to_string(impl_->bits); }

namespace {
// Affine quantization of n values read with a stride; fp16 scale and zero.
void quantize_strided(const float* x, int64_t n, int64_t stride, int bits, uint16_t* params, uint8_t* codes,
                      int64_t bit0, int64_t bit_stride) {
  const int levels = (1 << bits) - 1;
  float lo = x[0], hi = x[0];
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  params[0] = core::float_to_half((hi - lo) / static_cast<float>(levels));
  params[1] = core::float_to_half(lo);
  const float scale = core::half_to_float(params[0]), zero = core::half_to_float(params[1]);
  for (int64_t i = 0; i < n; ++i) {
    int q = scale > 0 ? static_cast<int>(std::lround((x[i * stride] - zero) / scale)) : 0;
    q = std::clamp(q, 0, levels);
    const int64_t bit = bit0 + i * bit_stride;
    codes[bit >> 3] |= static_cast<uint8_t>(q << (bit & 7));
  }
}
inline float dequant(const uint8_t* codes, int64_t bit, int bits, const uint16_t* params) {
  const int q = (codes[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
  return core::half_to_float(params[0]) * static_cast<float>(q) + core::half_to_float(params[1]);
}
}  // namespace

void KIVICache::append(const TensorView& keys, const TensorView& values, const char* method) {
  Impl& s = *impl_;
  cache::StagedInput in = cache::stage_input(std::string("anchorkv::KIVICache::") + method, keys, values,
                                             s.has_shape, s.B, s.H, s.D);
  const int64_t R = in.B() * in.H(), D = in.D();
  if (!s.has_shape) {
    s.has_shape = true;
    s.B = in.B();
    s.H = in.H();
    s.D = D;
    s.k_codes.resize(static_cast<size_t>(R));
    s.k_params.resize(s.k_codes.size());
    s.v_codes.resize(s.k_codes.size());
    s.v_params.resize(s.k_codes.size());
    s.window.resize_rows(R);
  }
  s.window.append(in);
  s.tokens += in.S();
  // Move whole key groups out of the window while it holds more than `residual` tokens.
  std::vector<float> kf(static_cast<size_t>(s.group * D)), vf(kf.size());
  while (s.window.tokens - s.group >= s.residual) {
    const int64_t G = s.group, kcb = s.k_group_code_bytes(), vcb = s.v_token_code_bytes(), vg = s.v_groups();
    for (int64_t r = 0; r < R; ++r) {
      core::f16_to_f32_n(s.window.k[r].data(), kf.data(), G * D);
      core::f16_to_f32_n(s.window.v[r].data(), vf.data(), G * D);
      const size_t kc0 = s.k_codes[r].size(), kp0 = s.k_params[r].size();
      s.k_codes[r].resize(kc0 + static_cast<size_t>(kcb), 0);
      s.k_params[r].resize(kp0 + static_cast<size_t>(2 * D));
      for (int64_t d = 0; d < D; ++d)  // per channel over the group's tokens; codes laid out [token, channel]
        quantize_strided(&kf[d], G, D, s.bits, &s.k_params[r][kp0 + 2 * d], &s.k_codes[r][kc0], d * s.bits,
                         D * s.bits);
      for (int64_t t = 0; t < G; ++t) {
        const size_t vc0 = s.v_codes[r].size(), vp0 = s.v_params[r].size();
        s.v_codes[r].resize(vc0 + static_cast<size_t>(vcb), 0);
        s.v_params[r].resize(vp0 + static_cast<size_t>(2 * vg));
        for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi)
          quantize_strided(&vf[t * D + g0], std::min(G, D - g0), 1, s.bits, &s.v_params[r][vp0 + 2 * gi],
                           &s.v_codes[r][vc0], g0 * s.bits, s.bits);
      }
      s.window.k[r].erase(s.window.k[r].begin(), s.window.k[r].begin() + G * D);
      s.window.v[r].erase(s.window.v[r].begin(), s.window.v[r].begin() + G * D);
    }
    s.window.tokens -= G;
    s.quantized += G;
  }
}

KVPair KIVICache::fetch() const {
  const Impl& s = *impl_;
  const int64_t n = s.tokens, D = s.D, G = s.group, kcb = s.k_group_code_bytes(),
                vcb = s.v_token_code_bytes(), vg = s.v_groups();
  KVPair out{Tensor(DType::kF16, {s.B, s.H, n, D}), Tensor(DType::kF16, {s.B, s.H, n, D})};
  for (int64_t r = 0; r < s.B * s.H; ++r) {
    uint16_t* ok = out.keys.data_as<uint16_t>() + r * n * D;
    uint16_t* ov = out.values.data_as<uint16_t>() + r * n * D;
    for (int64_t t = 0; t < s.quantized; ++t) {
      const int64_t g = t / G, tt = t % G;
      for (int64_t d = 0; d < D; ++d) {
        ok[t * D + d] = core::float_to_half(
            dequant(&s.k_codes[r][g * kcb], (tt * D + d) * s.bits, s.bits, &s.k_params[r][(g * D + d) * 2]));
        ov[t * D + d] = core::float_to_half(
            dequant(&s.v_codes[r][t * vcb], d * s.bits, s.bits, &s.v_params[r][(t * vg + d / G) * 2]));
      }
    }
    std::copy(s.window.k[r].begin(), s.window.k[r].end(), ok + s.quantized * D);
    std::copy(s.window.v[r].begin(), s.window.v[r].end(), ov + s.quantized * D);
  }
  return out;
}

int64_t KIVICache::offset() const { return impl_->tokens; }
int64_t KIVICache::nbytes() const {
  const Impl& s = *impl_;
  int64_t n = s.window.buffer_bytes();
  for (size_t r = 0; r < s.k_codes.size(); ++r)
    n += static_cast<int64_t>(s.k_codes[r].size() + s.v_codes[r].size() +
                              2 * (s.k_params[r].size() + s.v_params[r].size()));
  return n;
}
int64_t KIVICache::full_seq_bytes() const { return impl_->tokens * impl_->B * impl_->H * impl_->D * 4; }
int64_t KIVICache::tokens_total() const { return impl_->tokens * impl_->B * impl_->H; }

// ============================================================== H2O

struct H2OCache::Impl {
  double theta, recent_share;
  bool has_shape = false, selected = false;
  int64_t B = 0, H = 0, D = 0, seen = 0, capacity = 0;
  cache::ExactRows kept;                  // rows x [n, D] fp16
  std::vector<std::vector<float>> score;  // rows x [n] accumulated attention
};

H2OCache::H2OCache(double theta, double recent_share) : impl_(std::make_unique<Impl>()) {
  constexpr const char* op = "anchorkv::H2OCache";
  if (!std::isfinite(theta) || theta < 0.0 || theta > 1.0)
    core::fail(ErrorCode::kInvalidConfig, op,
               "invalid theta: must be in [0, 1], got " + std::to_string(theta));
  if (!std::isfinite(recent_share) || recent_share < 0.0 || recent_share > 1.0)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid recent_share: must be in [0, 1]");
  impl_->theta = theta;
  impl_->recent_share = recent_share;
}
H2OCache::~H2OCache() = default;

void H2OCache::append(const TensorView& keys, const TensorView& values, const char* method) {
  Impl& s = *impl_;
  const cache::StagedInput in = cache::stage_input(std::string("anchorkv::H2OCache::") + method, keys, values,
                                                   s.has_shape, s.B, s.H, s.D);
  const int64_t S = in.S(), D = in.D(), R = in.B() * in.H();
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  if (!s.selected && S > 1) {
    // Budget in tokens, the stored score (4 bytes) counted: T * (4 D + 4) <= theta * S * 4 D.
    const int64_t T = std::clamp<int64_t>(
        static_cast<int64_t>(std::floor(s.theta * static_cast<double>(S) * 4.0 * D / (4.0 * D + 4.0))), 1, S);
    const int64_t n_recent = std::min<int64_t>(T, static_cast<int64_t>(std::llround(s.recent_share * T)));
    cache::ExactRows rows;
    rows.resize_rows(R);
    std::vector<std::vector<float>> scores(static_cast<size_t>(R));
    core::parallel_for(R, 0, [&](int64_t r) {  // rows are independent: same result for any thread count
      std::vector<float> row(static_cast<size_t>(S));
      const float* K = in.key_row(r);
      // Accumulated causal attention received, every key acting as a query.
      std::vector<double> acc(static_cast<size_t>(S), 0.0);
      for (int64_t i = 0; i < S; ++i) {
        core::dot_matrix(K + i * D, 1, D, K, i + 1, D, D, row.data(), i + 1);
        for (int64_t t = 0; t <= i; ++t) row[t] *= inv;
        compress::softmax_inplace(row.data(), i + 1);
        for (int64_t t = 0; t <= i; ++t) acc[t] += row[t];
      }
      std::vector<int32_t> cand(static_cast<size_t>(S - n_recent));
      std::iota(cand.begin(), cand.end(), 0);
      const int64_t heavy = std::min<int64_t>(T - n_recent, static_cast<int64_t>(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + heavy, cand.end(),
                        [&](int32_t a, int32_t b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
      std::vector<int32_t> keep(cand.begin(), cand.begin() + heavy);
      for (int64_t t = S - n_recent; t < S; ++t) keep.push_back(static_cast<int32_t>(t));
      std::sort(keep.begin(), keep.end());
      rows.k[r].resize(keep.size() * static_cast<size_t>(D));
      rows.v[r].resize(rows.k[r].size());
      for (size_t i = 0; i < keep.size(); ++i) {
        core::f32_to_f16_n(K + keep[i] * D, &rows.k[r][i * D], D);
        core::f32_to_f16_n(in.value_row(r) + keep[i] * D, &rows.v[r][i * D], D);
        scores[r].push_back(static_cast<float>(acc[keep[i]]));
      }
    });
    rows.tokens = T;
    s.kept = std::move(rows);
    s.score = std::move(scores);
    s.selected = true;
    s.capacity = T;
  } else {
    // Decode (or anything before the prefill): append; each new key attends over
    // what is kept and adds to the scores; over capacity, evict the lowest
    // scorer outside the recent window.
    cache::ExactRows rows = s.kept;
    auto scores = s.score;
    rows.append(in);
    scores.resize(static_cast<size_t>(R));
    std::vector<float> k(static_cast<size_t>(D)), logit;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t t = 0; t < S; ++t) {
        scores[r].push_back(0.0f);
        const int64_t n = static_cast<int64_t>(scores[r].size()) - S + t + 1;  // tokens visible to this one
        core::f16_to_f32_n(&rows.k[r][(n - 1) * D], k.data(), D);
        std::vector<float> kf(static_cast<size_t>(n * D));
        core::f16_to_f32_n(rows.k[r].data(), kf.data(), n * D);
        logit.resize(static_cast<size_t>(n));
        core::dot_matrix(k.data(), 1, D, kf.data(), n, D, D, logit.data(), n);
        for (auto& x : logit) x *= inv;
        compress::softmax_inplace(logit.data(), n);
        for (int64_t i = 0; i < n; ++i) scores[r][i] += logit[i];
      }
    }
    if (s.selected) {
      const int64_t n_recent =
          std::min<int64_t>(s.capacity, static_cast<int64_t>(std::llround(s.recent_share * s.capacity)));
      while (rows.tokens > s.capacity) {
        const int64_t limit = rows.tokens - n_recent;  // candidates [0, limit)
        for (int64_t r = 0; r < R; ++r) {
          int64_t worst = 0;
          for (int64_t i = 1; i < limit; ++i)
            if (scores[r][i] < scores[r][worst]) worst = i;
          if (limit <= 0) worst = 0;
          rows.k[r].erase(rows.k[r].begin() + worst * D, rows.k[r].begin() + (worst + 1) * D);
          rows.v[r].erase(rows.v[r].begin() + worst * D, rows.v[r].begin() + (worst + 1) * D);
          scores[r].erase(scores[r].begin() + worst);
        }
        --rows.tokens;
      }
    }
    s.kept = std::move(rows);
    s.score = std::move(scores);
  }
  if (!s.has_shape) {
    s.has_shape = true;
    s.B = in.B();
    s.H = in.H();
    s.D = D;
  }
  s.seen += S;
}

KVPair H2OCache::fetch() const { return impl_->kept.to_pair(impl_->B, impl_->H, impl_->D); }

int64_t H2OCache::offset() const { return impl_->seen; }
int64_t H2OCache::nbytes() const {
  int64_t n = impl_->kept.buffer_bytes();
  for (const auto& s : impl_->score) n += static_cast<int64_t>(s.size() * sizeof(float));
  return n;
}
int64_t H2OCache::full_seq_bytes() const { return impl_->seen * impl_->B * impl_->H * impl_->D * 4; }
int64_t H2OCache::tokens_total() const { return impl_->seen * impl_->B * impl_->H; }
int64_t H2OCache::tokens_kept() const { return impl_->kept.tokens * impl_->B * impl_->H; }

}  // namespace anchorkv
