// TurboQuantCache: every token's key and value coded whole by
// compress::TokenCoder on append (prefill and decode alike), so the ratio
// holds over a whole session. Attention scores the codes in the rotated
// domain (kernels/coded_attention.h) and never rebuilds fp16 K/V.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anchorkv/baselines.h"
#include "cache/core.h"
#include "compress/token_coder.h"
#include "core/error.h"
#include "core/half.h"

namespace anchorkv {
namespace {

using internal::CacheShape;
constexpr const char* kOp = "anchorkv::TurboQuantCache";
constexpr uint64_t kValueSeed = 0x5c2f1e8d3a7b9064ULL;  // values' rotations differ from the keys'

// One side (keys or values) of every row.
struct CodedRows {
  std::vector<std::vector<int32_t>> channels;    // [rows][D]: the row's channel order (empty before tokens)
  std::vector<std::vector<uint8_t>> codes[2];    // [rows][n * code_bytes(g)] per group
  std::vector<std::vector<uint16_t>> scales[2];  // [rows][n] per group
};

class TurboQuantStore final : public internal::CacheStore {
 public:
  TurboQuantStore(int key_quarters, int value_quarters, uint64_t seed)
      : kq_(key_quarters), vq_(value_quarters), seed_(seed) {
    compress::TokenCoder(128, kq_, seed_);  // validates the widths before any token arrives
    compress::TokenCoder(128, vq_, seed_);
  }
  std::string name() const override { return "turboquant:" + TurboQuantCache::width_name(kq_ / 4.0, vq_ / 4.0); }
  const char* api_name() const override { return kOp; }

  void store(const cache::StagedInput& in, const CacheShape& shape) override;
  KVPair fetch(const CacheShape& s) const override;
  int64_t nbytes(const CacheShape& s) const override {
    if (!coder_k_) return 0;  // codes and scales of every token, and each row's channel orders
    return s.seen * s.rows() * (coder_k_->token_bytes() + coder_v_->token_bytes()) +
           static_cast<int64_t>(k_.channels.size() + v_.channels.size()) * s.D * 4;
  }
  cache::AttentionSource attention_source(const CacheShape& s) const override;

  void save_config(cache::ByteWriter& w) const override {
    w.put<int32_t>(kq_);
    w.put<int32_t>(vq_);
    w.put<uint64_t>(seed_);
  }
  void save_state(cache::ByteWriter& w, const CacheShape& s) const override;
  void load_state(cache::ByteReader& r, const CacheShape& s) override;

 private:
  void ensure_coders(int64_t D) {
    if (coder_k_) return;
    coder_k_.emplace(D, kq_, seed_);
    coder_v_.emplace(D, vq_, seed_ ^ kValueSeed);
  }
  static void reserve_side(const compress::TokenCoder& coder, CodedRows& rows, const cache::StagedInput& in,
                           bool keys);
  static void append_side(const compress::TokenCoder& coder, CodedRows& rows, const cache::StagedInput& in,
                          bool keys, float* scratch) noexcept;
  static void save_side(cache::ByteWriter& w, const compress::TokenCoder& coder, const CodedRows& rows);
  static CodedRows load_side(cache::ByteReader& r, const compress::TokenCoder& coder, const CacheShape& s,
                             const char* side);

  int kq_, vq_;
  uint64_t seed_;
  std::optional<compress::TokenCoder> coder_k_, coder_v_;  // built at the first call (they need D)
  CodedRows k_, v_;
};

// Room for `needed` elements, growing by an eighth at least: a decode step
// appends one token, and an exact reserve would copy the row every step.
template <class T>
void reserve_grow(std::vector<T>& v, size_t needed) {
  if (v.capacity() < needed) v.reserve(std::max(needed, v.capacity() + v.capacity() / 8));
}

// Strong guarantee: every allocation happens in reserve_side (rows untouched
// but for capacity), then append_side codes the tokens, which cannot throw.
void TurboQuantStore::reserve_side(const compress::TokenCoder& coder, CodedRows& rows, const cache::StagedInput& in,
                                   bool keys) {
  const int64_t R = in.B() * in.H(), S = in.S(), D = in.D();
  if (rows.channels.empty()) {  // the first tokens: each row's channel order from them
    CodedRows first;
    for (int64_t r = 0; r < R; ++r)
      first.channels.push_back(
          compress::choose_wide_channels(keys ? in.key_row(r) : in.value_row(r), S, D, coder.wide_channels()));
    for (int g = 0; g < 2; ++g) {
      first.codes[g].resize(static_cast<size_t>(R));
      first.scales[g].resize(static_cast<size_t>(R));
    }
    rows = std::move(first);
  }
  for (int64_t r = 0; r < R; ++r)
    for (int g = 0; g < coder.groups(); ++g) {
      reserve_grow(rows.codes[g][r], rows.codes[g][r].size() + static_cast<size_t>(S * coder.code_bytes(g)));
      reserve_grow(rows.scales[g][r], rows.scales[g][r].size() + static_cast<size_t>(S));
    }
}

void TurboQuantStore::append_side(const compress::TokenCoder& coder, CodedRows& rows, const cache::StagedInput& in,
                                  bool keys, float* scratch) noexcept {
  const int64_t R = in.B() * in.H(), S = in.S(), D = in.D();
  const int G = coder.groups();
  for (int64_t r = 0; r < R; ++r) {
    const float* x = keys ? in.key_row(r) : in.value_row(r);
    const size_t t0 = rows.scales[0][r].size();
    for (int g = 0; g < G; ++g) {  // within the reserved capacity
      rows.codes[g][r].resize(rows.codes[g][r].size() + static_cast<size_t>(S * coder.code_bytes(g)), 0);
      rows.scales[g][r].resize(t0 + static_cast<size_t>(S));
    }
    uint8_t* codes[2] = {nullptr, nullptr};
    uint16_t scales[2] = {0, 0};
    for (int64_t t = 0; t < S; ++t) {
      for (int g = 0; g < G; ++g) codes[g] = &rows.codes[g][r][(t0 + t) * coder.code_bytes(g)];
      coder.encode(x + t * D, rows.channels[r].data(), codes, scales, scratch);
      for (int g = 0; g < G; ++g) rows.scales[g][r][t0 + t] = scales[g];
    }
  }
}

void TurboQuantStore::store(const cache::StagedInput& in, const CacheShape& shape) {
  if (in.S() == 0) return;
  std::optional<compress::TokenCoder> ck = coder_k_, cv = coder_v_;
  if (!ck) {
    ck.emplace(shape.D, kq_, seed_);
    cv.emplace(shape.D, vq_, seed_ ^ kValueSeed);
  }
  std::vector<float> scratch(static_cast<size_t>(4 * shape.D));
  // A first call's rows are built aside (a throw leaves the store empty);
  // later calls only reserve before anything is written.
  CodedRows k0, v0;
  CodedRows& k = k_.channels.empty() ? k0 : k_;
  CodedRows& v = v_.channels.empty() ? v0 : v_;
  reserve_side(*ck, k, in, true);
  reserve_side(*cv, v, in, false);
  append_side(*ck, k, in, true, scratch.data());
  append_side(*cv, v, in, false, scratch.data());
  if (&k == &k0) k_ = std::move(k0);
  if (&v == &v0) v_ = std::move(v0);
  coder_k_ = std::move(ck);
  coder_v_ = std::move(cv);
}

KVPair TurboQuantStore::fetch(const CacheShape& s) const {
  const int64_t n = s.seen, D = s.D;
  KVPair out{Tensor(DType::kF16, {s.B, s.H, n, D}), Tensor(DType::kF16, {s.B, s.H, n, D})};
  if (n == 0) return out;
  std::vector<float> x(static_cast<size_t>(D)), scratch(static_cast<size_t>(2 * D));
  for (int side = 0; side < 2; ++side) {
    const compress::TokenCoder& coder = side == 0 ? *coder_k_ : *coder_v_;
    const CodedRows& rows = side == 0 ? k_ : v_;
    uint16_t* dst = (side == 0 ? out.keys : out.values).data_as<uint16_t>();
    for (int64_t r = 0; r < s.rows(); ++r)
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t* codes[2] = {nullptr, nullptr};
        uint16_t scales[2] = {0, 0};
        for (int g = 0; g < coder.groups(); ++g) {
          codes[g] = &rows.codes[g][r][t * coder.code_bytes(g)];
          scales[g] = rows.scales[g][r][t];
        }
        coder.decode(codes, scales, rows.channels[r].data(), x.data(), scratch.data());
        for (int64_t d = 0; d < D; ++d) dst[(r * n + t) * D + d] = core::float_to_half(x[d]);
      }
  }
  return out;
}

cache::AttentionSource TurboQuantStore::attention_source(const CacheShape& s) const {
  cache::AttentionSource src{s.B, s.H, s.D, s.seen};
  if (s.seen == 0) return src;
  cache::DenseRegion reg;
  reg.n = s.seen;
  for (int64_t r = 0; r < s.rows(); ++r) {
    compress::CodedRowView view;
    for (int side = 0; side < 2; ++side) {
      const CodedRows& rows = side == 0 ? k_ : v_;
      compress::CodedSideView& sv = side == 0 ? view.k : view.v;
      sv.coder = side == 0 ? &*coder_k_ : &*coder_v_;
      sv.channels = rows.channels[r].data();
      for (int g = 0; g < sv.coder->groups(); ++g) {
        sv.codes[g] = rows.codes[g][r].data();
        sv.scales[g] = rows.scales[g][r].data();
      }
    }
    reg.coded.push_back(view);
  }
  src.dense_after.push_back(std::move(reg));
  return src;
}

void TurboQuantStore::save_side(cache::ByteWriter& w, const compress::TokenCoder& coder, const CodedRows& rows) {
  for (size_t r = 0; r < rows.channels.size(); ++r) {
    w.array(rows.channels[r]);
    for (int g = 0; g < coder.groups(); ++g) {
      w.array(rows.codes[g][r]);
      w.array(rows.scales[g][r]);
    }
  }
}

void TurboQuantStore::save_state(cache::ByteWriter& w, const CacheShape&) const {
  w.put<uint64_t>(k_.channels.size());
  if (k_.channels.empty()) return;
  save_side(w, *coder_k_, k_);
  save_side(w, *coder_v_, v_);
}

CodedRows TurboQuantStore::load_side(cache::ByteReader& r, const compress::TokenCoder& coder, const CacheShape& s,
                                     const char* side) {
  CodedRows rows;
  const auto R = static_cast<size_t>(s.rows()), D = static_cast<uint64_t>(s.D), n = static_cast<uint64_t>(s.seen);
  rows.channels.resize(R);
  for (int g = 0; g < 2; ++g) {
    rows.codes[g].resize(R);
    rows.scales[g].resize(R);
  }
  const std::string field = std::string(side) + ".channels";
  for (size_t i = 0; i < R; ++i) {
    rows.channels[i] = r.array<int32_t>(field.c_str(), D);
    if (!compress::valid_channel_order(rows.channels[i].data(), s.D, coder.wide_channels()))
      r.fail(field.c_str(), "not a channel order (a permutation, ascending within each group)");
    for (int g = 0; g < coder.groups(); ++g) {
      rows.codes[g][i] = r.array<uint8_t>("codes", n * static_cast<uint64_t>(coder.code_bytes(g)));
      rows.scales[g][i] = r.halves("scales", n);
    }
  }
  return rows;
}

void TurboQuantStore::load_state(cache::ByteReader& r, const CacheShape& s) {
  const uint64_t R = r.get<uint64_t>("rows");
  if (R == 0) {
    if (s.seen > 0) r.fail("rows", "no rows for a cache that holds tokens");
    return;
  }
  if (R != static_cast<uint64_t>(s.rows()) || s.seen == 0)
    r.fail("rows", std::to_string(R) + " rows, expected " + std::to_string(s.rows()) + " with tokens held");
  TurboQuantStore q(kq_, vq_, seed_);
  q.ensure_coders(s.D);
  q.k_ = load_side(r, *q.coder_k_, s, "keys");
  q.v_ = load_side(r, *q.coder_v_, s, "values");
  *this = std::move(q);
}

int to_quarters(double bits, const char* side) {
  const double q = bits * 4;
  if (!(q >= 4 && q <= 16) || q != std::round(q))
    core::fail(ErrorCode::kInvalidConfig, kOp,
               std::string("invalid ") + side + " bits " + std::to_string(bits) +
                   ": must be 1 to 4 in steps of 0.25");
  return static_cast<int>(q);
}

}  // namespace

std::string TurboQuantCache::width_name(double key_bits, double value_bits) {
  char buf[64];  // quarters print exactly in %g: "4", "2.5", "1.75"
  std::snprintf(buf, sizeof buf, "k%gv%g", key_bits, value_bits);
  return buf;
}

int64_t TurboQuantCache::token_side_bytes(int64_t D, double bits) {
  return compress::TokenCoder(D, to_quarters(bits, "the"), 0).token_bytes();
}

TurboQuantCache::TurboQuantCache(double key_bits, double value_bits, uint64_t seed)
    : KVCache(std::make_unique<TurboQuantStore>(to_quarters(key_bits, "key"), to_quarters(value_bits, "value"),
                                                seed)) {}

std::unique_ptr<KVCache> internal::turboquant_cache_from_config(cache::ByteReader& r) {
  const int kq = r.get<int32_t>("config.key_quarters");
  const int vq = r.get<int32_t>("config.value_quarters");
  const uint64_t seed = r.get<uint64_t>("config.seed");
  return internal::rebuild(r, "config", [&] { return std::make_unique<TurboQuantCache>(kq / 4.0, vq / 4.0, seed); });
}

}  // namespace anchorkv
