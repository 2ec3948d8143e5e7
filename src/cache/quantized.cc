// The quantized baselines: group-wise affine quantization of every token
// (QuantizedKVCache) and KIVI (keys per channel, values per token, an fp16
// window). Both use cache/affine.h; attention reads their codes in place
// (kernels/coded_attention.h) where every token's codes fill whole bytes, and
// their dense fetch otherwise.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "anchorkv/baselines.h"
#include "cache/affine.h"
#include "cache/core.h"
#include "core/convert.h"
#include "core/error.h"

namespace anchorkv {

namespace cache {
void affine_quantize(const float* x, int64_t n, int64_t stride, int bits, uint16_t* params, uint8_t* codes,
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
}  // namespace cache

namespace {

using internal::CacheShape;

// Groups a cache file may carry (keeps every size product far from overflow).
constexpr int64_t kMaxSavedGroup = int64_t{1} << 20;

// Per-row buffers are sized at the first call: a saved store holds 0 rows
// (nothing stored yet) or B * H.
uint64_t checked_rows(cache::ByteReader& r, const CacheShape& s) {
  const uint64_t R = r.get<uint64_t>("rows");
  if (R != 0 && R != static_cast<uint64_t>(s.rows()))
    r.fail("rows", std::to_string(R) + " rows, expected 0 or " + std::to_string(s.rows()));
  if (R == 0 && s.seen > 0) r.fail("rows", "no rows for a cache that holds tokens");
  return R;
}

// ============================================================== quantized

class QuantizedStore final : public internal::CacheStore {
 public:
  QuantizedStore(int bits, int64_t group) : bits_(bits), group_(group) {}
  std::string name() const override { return "quantized" + std::to_string(bits_); }
  const char* api_name() const override { return "anchorkv::QuantizedKVCache"; }

  void store(const cache::StagedInput& in, const CacheShape& shape) override {
    const int64_t R = shape.rows(), S = in.S(), D = shape.D, cb = code_bytes(D), np = 2 * groups(D);
    for (auto* rows : {&codes_k_, &codes_v_}) rows->resize(static_cast<size_t>(R));
    for (auto* rows : {&params_k_, &params_v_}) rows->resize(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r)
      for (int side = 0; side < 2; ++side) {
        auto& codes = side == 0 ? codes_k_[r] : codes_v_[r];
        auto& params = side == 0 ? params_k_[r] : params_v_[r];
        const float* x = side == 0 ? in.key_row(r) : in.value_row(r);
        const size_t c0 = codes.size(), p0 = params.size();
        codes.resize(c0 + static_cast<size_t>(S * cb), 0);
        params.resize(p0 + static_cast<size_t>(S * np));
        for (int64_t t = 0; t < S; ++t)
          for (int64_t g0 = 0, gi = 0; g0 < D; g0 += group_, ++gi)
            cache::affine_quantize(x + t * D + g0, std::min(group_, D - g0), 1, bits_,
                                   &params[p0 + t * np + 2 * gi], &codes[c0 + t * cb], g0 * bits_, bits_);
      }
  }

  KVPair fetch(const CacheShape& s) const override {
    const int64_t n = s.seen, D = s.D, cb = code_bytes(D), np = 2 * groups(D);
    KVPair out{Tensor(DType::kF16, {s.B, s.H, n, D}), Tensor(DType::kF16, {s.B, s.H, n, D})};
    for (int64_t r = 0; r < s.rows(); ++r)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t bit = d * bits_, p = t * np + 2 * (d / group_);
          out.keys.data_as<uint16_t>()[(r * n + t) * D + d] =
              core::float_to_half(cache::affine_dequantize(&codes_k_[r][t * cb], bit, bits_, &params_k_[r][p]));
          out.values.data_as<uint16_t>()[(r * n + t) * D + d] =
              core::float_to_half(cache::affine_dequantize(&codes_v_[r][t * cb], bit, bits_, &params_v_[r][p]));
        }
    return out;
  }

  cache::AttentionSource attention_source(const CacheShape& s) const override {
    if (!cache::affine_attention_supported(s.D, bits_, group_)) return cache::dense_source(fetch(s));
    cache::AttentionSource src{s.B, s.H, s.D, s.seen};
    if (s.seen == 0) return src;
    cache::DenseRegion reg;
    reg.n = s.seen;
    for (int64_t r = 0; r < s.rows(); ++r)
      reg.affine.push_back({side(codes_k_[r], params_k_[r], s.D), side(codes_v_[r], params_v_[r], s.D)});
    src.dense_after.push_back(std::move(reg));
    return src;
  }

  void save_config(cache::ByteWriter& w) const override {
    w.put<int32_t>(bits_);
    w.put<int64_t>(group_);
  }
  void save_state(cache::ByteWriter& w, const CacheShape&) const override {
    w.put<uint64_t>(codes_k_.size());
    for (size_t r = 0; r < codes_k_.size(); ++r) {
      w.array(codes_k_[r]);
      w.array(codes_v_[r]);
      w.array(params_k_[r]);
      w.array(params_v_[r]);
    }
  }
  void load_state(cache::ByteReader& r, const CacheShape& s) override {
    const uint64_t R = checked_rows(r, s);
    const auto codes = static_cast<uint64_t>(s.seen * code_bytes(s.D)), params = static_cast<uint64_t>(s.seen * 2 * groups(s.D));
    QuantizedStore q(bits_, group_);
    for (auto* rows : {&q.codes_k_, &q.codes_v_}) rows->resize(R);
    for (auto* rows : {&q.params_k_, &q.params_v_}) rows->resize(R);
    for (uint64_t i = 0; i < R; ++i) {
      q.codes_k_[i] = r.array<uint8_t>("codes_k", codes);
      q.codes_v_[i] = r.array<uint8_t>("codes_v", codes);
      q.params_k_[i] = r.halves("params_k", params);
      q.params_v_[i] = r.halves("params_v", params);
    }
    *this = std::move(q);
  }

  int64_t nbytes(const CacheShape&) const override {
    int64_t n = 0;
    for (size_t r = 0; r < codes_k_.size(); ++r)
      n += static_cast<int64_t>(codes_k_[r].size() + codes_v_[r].size() +
                                2 * (params_k_[r].size() + params_v_[r].size()));
    return n;
  }

 private:
  int64_t groups(int64_t D) const { return (D + group_ - 1) / group_; }
  int64_t code_bytes(int64_t D) const { return (D * bits_ + 7) / 8; }
  cache::AffineSideView side(const std::vector<uint8_t>& codes, const std::vector<uint16_t>& params,
                             int64_t D) const {
    return {codes.data(), params.data(), bits_, code_bytes(D), group_, 0};
  }
  int bits_;
  int64_t group_;
  // Per row and side: codes [n, ceil(D*bits/8)], params [n, groups, 2] fp16 (scale, bias).
  std::vector<std::vector<uint8_t>> codes_k_, codes_v_;
  std::vector<std::vector<uint16_t>> params_k_, params_v_;
};

// ============================================================== KIVI

class KIVIStore final : public internal::CacheStore {
 public:
  KIVIStore(int bits, int64_t group, int64_t residual) : bits_(bits), group_(group), residual_(residual) {}
  std::string name() const override { return "kivi" + std::to_string(bits_); }
  const char* api_name() const override { return "anchorkv::KIVICache"; }

  void store(const cache::StagedInput& in, const CacheShape& shape) override {
    const int64_t R = shape.rows();
    for (auto* rows : {&k_codes_, &v_codes_}) rows->resize(static_cast<size_t>(R));
    for (auto* rows : {&k_params_, &v_params_}) rows->resize(static_cast<size_t>(R));
    window_.resize_rows(R);
    window_.append(in);
    // Whole key groups leave the window while it holds a group beyond `residual` tokens.
    const int64_t spare = window_.tokens - residual_;
    if (spare >= group_) quantize_oldest_groups(R, shape.D, spare / group_);
  }

  KVPair fetch(const CacheShape& s) const override;
  cache::AttentionSource attention_source(const CacheShape& s) const override;

  void save_config(cache::ByteWriter& w) const override {
    w.put<int32_t>(bits_);
    w.put<int64_t>(group_);
    w.put<int64_t>(residual_);
  }
  void save_state(cache::ByteWriter& w, const CacheShape&) const override {
    w.put<int64_t>(quantized_);
    cache::save_rows(w, window_);
    w.put<uint64_t>(k_codes_.size());
    for (size_t r = 0; r < k_codes_.size(); ++r) {
      w.array(k_codes_[r]);
      w.array(k_params_[r]);
      w.array(v_codes_[r]);
      w.array(v_params_[r]);
    }
  }
  void load_state(cache::ByteReader& r, const CacheShape& s) override;

  int64_t nbytes(const CacheShape&) const override {
    int64_t n = window_.buffer_bytes();
    for (size_t r = 0; r < k_codes_.size(); ++r)
      n += static_cast<int64_t>(k_codes_[r].size() + v_codes_[r].size() +
                                2 * (k_params_[r].size() + v_params_[r].size()));
    return n;
  }

 private:
  void quantize_oldest_groups(int64_t R, int64_t D, int64_t groups);
  int64_t k_group_code_bytes(int64_t D) const { return (group_ * D * bits_ + 7) / 8; }
  int64_t v_token_code_bytes(int64_t D) const { return (D * bits_ + 7) / 8; }
  int64_t v_groups(int64_t D) const { return (D + group_ - 1) / group_; }

  int bits_;
  int64_t group_, residual_;
  int64_t quantized_ = 0;  // tokens per row that left the fp16 window (a multiple of group)
  // Keys: per row, per token group: codes [group, D] packed along the group's
  // tokens per channel, params [D, 2] fp16 (scale, zero).
  std::vector<std::vector<uint8_t>> k_codes_;
  std::vector<std::vector<uint16_t>> k_params_;
  // Values: per row, per token: codes [D] packed, params [ceil(D/group), 2] fp16.
  std::vector<std::vector<uint8_t>> v_codes_;
  std::vector<std::vector<uint16_t>> v_params_;
  cache::ExactRows window_;  // the fp16 tail, rows x [n, D]
};

// The window's first `groups` key groups quantized, then dropped from it at
// once (one move of the window, not one per group).
void KIVIStore::quantize_oldest_groups(int64_t R, int64_t D, int64_t groups) {
  const int64_t G = group_, kcb = k_group_code_bytes(D), vcb = v_token_code_bytes(D), vg = v_groups(D);
  std::vector<float> kf(static_cast<size_t>(G * D)), vf(kf.size());
  for (int64_t r = 0; r < R; ++r) {
    const size_t kc0 = k_codes_[r].size(), kp0 = k_params_[r].size();
    const size_t vc0 = v_codes_[r].size(), vp0 = v_params_[r].size();
    k_codes_[r].resize(kc0 + static_cast<size_t>(groups * kcb), 0);
    k_params_[r].resize(kp0 + static_cast<size_t>(groups * 2 * D));
    v_codes_[r].resize(vc0 + static_cast<size_t>(groups * G * vcb), 0);
    v_params_[r].resize(vp0 + static_cast<size_t>(groups * G * 2 * vg));
    for (int64_t j = 0; j < groups; ++j) {
      core::f16_to_f32_n(window_.k[r].data() + j * G * D, kf.data(), G * D);
      core::f16_to_f32_n(window_.v[r].data() + j * G * D, vf.data(), G * D);
      uint8_t* kc = &k_codes_[r][kc0 + static_cast<size_t>(j * kcb)];
      uint16_t* kp = &k_params_[r][kp0 + static_cast<size_t>(j * 2 * D)];
      for (int64_t d = 0; d < D; ++d)  // per channel over the group's tokens; codes laid out [token, channel]
        cache::affine_quantize(&kf[d], G, D, bits_, &kp[2 * d], kc, d * bits_, D * bits_);
      for (int64_t t = 0; t < G; ++t) {
        uint8_t* vc = &v_codes_[r][vc0 + static_cast<size_t>((j * G + t) * vcb)];
        uint16_t* vp = &v_params_[r][vp0 + static_cast<size_t>((j * G + t) * 2 * vg)];
        for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi)
          cache::affine_quantize(&vf[t * D + g0], std::min(G, D - g0), 1, bits_, &vp[2 * gi], vc, g0 * bits_, bits_);
      }
    }
  }
  window_.drop_front(groups * G, D);
  quantized_ += groups * G;
}

void KIVIStore::load_state(cache::ByteReader& r, const CacheShape& s) {
  KIVIStore q(bits_, group_, residual_);
  q.quantized_ = r.get<int64_t>("quantized");
  if (q.quantized_ < 0 || q.quantized_ > s.seen || q.quantized_ % group_ != 0)
    r.fail("quantized", "must be a multiple of the group within the tokens seen");
  q.window_ = cache::load_rows(r, s.rows(), s.D, "window");
  if (q.quantized_ + q.window_.tokens != s.seen) r.fail("window", "quantized + window tokens differ from the tokens seen");
  const uint64_t R = checked_rows(r, s);
  const auto groups = static_cast<uint64_t>(q.quantized_ / group_), n = static_cast<uint64_t>(q.quantized_);
  const auto D = static_cast<uint64_t>(s.D);
  for (auto* rows : {&q.k_codes_, &q.v_codes_}) rows->resize(R);
  for (auto* rows : {&q.k_params_, &q.v_params_}) rows->resize(R);
  for (uint64_t i = 0; i < R; ++i) {
    q.k_codes_[i] = r.array<uint8_t>("k_codes", groups * static_cast<uint64_t>(k_group_code_bytes(s.D)));
    q.k_params_[i] = r.halves("k_params", groups * 2 * D);
    q.v_codes_[i] = r.array<uint8_t>("v_codes", n * static_cast<uint64_t>(v_token_code_bytes(s.D)));
    q.v_params_[i] = r.halves("v_params", n * 2 * static_cast<uint64_t>(v_groups(s.D)));
  }
  *this = std::move(q);
}

KVPair KIVIStore::fetch(const CacheShape& s) const {
  const int64_t n = s.seen, D = s.D, G = group_, kcb = k_group_code_bytes(D), vcb = v_token_code_bytes(D),
                vg = v_groups(D);
  KVPair out{Tensor(DType::kF16, {s.B, s.H, n, D}), Tensor(DType::kF16, {s.B, s.H, n, D})};
  for (int64_t r = 0; r < s.rows(); ++r) {
    uint16_t* ok = out.keys.data_as<uint16_t>() + r * n * D;
    uint16_t* ov = out.values.data_as<uint16_t>() + r * n * D;
    for (int64_t t = 0; t < quantized_; ++t) {
      const int64_t g = t / G, tt = t % G;
      for (int64_t d = 0; d < D; ++d) {
        ok[t * D + d] = core::float_to_half(cache::affine_dequantize(
            &k_codes_[r][g * kcb], (tt * D + d) * bits_, bits_, &k_params_[r][(g * D + d) * 2]));
        ov[t * D + d] = core::float_to_half(cache::affine_dequantize(&v_codes_[r][t * vcb], d * bits_, bits_,
                                                                     &v_params_[r][(t * vg + d / G) * 2]));
      }
    }
    std::copy(window_.k[r].begin(), window_.k[r].end(), ok + quantized_ * D);
    std::copy(window_.v[r].begin(), window_.v[r].end(), ov + quantized_ * D);
  }
  return out;
}

// The quantized groups as affine codes (keys per channel over each group of
// tokens, values per token), then the fp16 window.
cache::AttentionSource KIVIStore::attention_source(const CacheShape& s) const {
  if (!cache::affine_attention_supported(s.D, bits_, group_)) return cache::dense_source(fetch(s));
  cache::AttentionSource src{s.B, s.H, s.D, s.seen};
  if (s.seen == 0) return src;
  if (quantized_ > 0) {
    cache::DenseRegion reg;
    reg.n = quantized_;
    const int64_t token_bytes = v_token_code_bytes(s.D);  // a key token's codes too: D * bits fills whole bytes
    for (int64_t r = 0; r < s.rows(); ++r)
      reg.affine.push_back({{k_codes_[r].data(), k_params_[r].data(), bits_, token_bytes, 0, group_},
                            {v_codes_[r].data(), v_params_[r].data(), bits_, token_bytes, group_, 0}});
    src.dense_after.push_back(std::move(reg));
  }
  if (window_.tokens > 0) src.dense_after.push_back(cache::dense_region(window_, quantized_));
  return src;
}

std::unique_ptr<internal::CacheStore> make_quantized(int bits, int64_t group_size) {
  constexpr const char* op = "anchorkv::QuantizedKVCache";
  if (bits != 2 && bits != 4 && bits != 8)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid bits: must be 2, 4 or 8, got " + std::to_string(bits));
  if (group_size < 1) core::fail(ErrorCode::kInvalidConfig, op, "invalid group_size: must be >= 1");
  return std::make_unique<QuantizedStore>(bits, group_size);
}

std::unique_ptr<internal::CacheStore> make_kivi(int bits, int64_t group, int64_t residual) {
  constexpr const char* op = "anchorkv::KIVICache";
  if (bits != 2 && bits != 4)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid bits: must be 2 or 4, got " + std::to_string(bits));
  if (group < 1) core::fail(ErrorCode::kInvalidConfig, op, "invalid group: must be >= 1");
  if (residual < 0) core::fail(ErrorCode::kInvalidConfig, op, "invalid residual: must be >= 0");
  return std::make_unique<KIVIStore>(bits, group, residual);
}

}  // namespace

std::unique_ptr<KVCache> internal::quantized_cache_from_config(cache::ByteReader& r) {
  const int bits = r.get<int32_t>("config.bits");
  const int64_t group = r.get<int64_t>("config.group_size");
  if (group < 1 || group > kMaxSavedGroup) r.fail("config.group_size", "outside [1, 2^20]");
  return internal::rebuild(r, "config", [&] { return std::make_unique<QuantizedKVCache>(bits, group); });
}

std::unique_ptr<KVCache> internal::kivi_cache_from_config(cache::ByteReader& r) {
  const int bits = r.get<int32_t>("config.bits");
  const int64_t group = r.get<int64_t>("config.group");
  const int64_t residual = r.get<int64_t>("config.residual");
  if (group < 1 || group > kMaxSavedGroup) r.fail("config.group", "outside [1, 2^20]");
  return internal::rebuild(r, "config", [&] { return std::make_unique<KIVICache>(bits, group, residual); });
}

int64_t QuantizedKVCache::token_side_bytes(int64_t D, int bits, int64_t group_size) {
  return (D * bits + 7) / 8 + 4 * ((D + group_size - 1) / group_size);
}
QuantizedKVCache::QuantizedKVCache(int bits, int64_t group_size) : KVCache(make_quantized(bits, group_size)) {}
KIVICache::KIVICache(int bits, int64_t group, int64_t residual) : KVCache(make_kivi(bits, group, residual)) {}

}  // namespace anchorkv
