// Observation queries handed to caches with update(keys, values, queries).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "cache/registry.h"
#include "compress/compressor.h"

namespace anchorkv {
namespace {

using testing_util::bits_of;
using testing_util::random_kv;

constexpr int64_t B = 1, H = 2, S = 400, D = 32, G = 2, W = 8;

struct Prefill {
  std::vector<float> K = random_kv(B, H, S, D, 1, S), V = random_kv(B, H, S, D, 2);
  std::vector<float> Q;  // [B, H * G, W, D]: every query of row r points at key target[r]
  int64_t target[H] = {57, 203};
  Prefill() : Q(static_cast<size_t>(B * H * G * W * D)) {
    for (int64_t r = 0; r < H; ++r)
      for (int64_t j = 0; j < G * W; ++j)
        for (int64_t d = 0; d < D; ++d) Q[(r * G * W + j) * D + d] = 5.0f * K[(r * S + target[r]) * D + d];
  }
  // Positions [from, from + n) of every row.
  static TensorView slice(const std::vector<float>& X, int64_t from, int64_t n) {
    TensorView t{&X[from * D], DType::kF32, {B, H, n, D}, {H * S * D, S * D, D, 1}};
    return t;
  }
  TensorView k(int64_t from = 0, int64_t n = S) const { return slice(K, from, n); }
  TensorView v(int64_t from = 0, int64_t n = S) const { return slice(V, from, n); }
  TensorView q() const { return TensorView::f32(Q.data(), {B, H * G, W, D}); }
};

AnchorKVConfig scored_config() {
  AnchorKVConfig cfg;
  cfg.anchor_frac = 16.0 / S;  // 16 anchors: 8 trailing, 8 scored
  cfg.window = W;
  cfg.rho = 1.0;
  cfg.theta = 0.2;
  return cfg;
}

std::vector<int32_t> anchors_of(const AnchorKVCache& c, int64_t row) {
  return internal::unlocked_state(c).segments.front().rows[row].anchor_positions();
}

bool contains(const std::vector<int32_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

TEST(ObservationQueries, AnchorKVScoresWithThemAndMatchesTheCompressor) {
  const Prefill p;
  AnchorKVCache with(scored_config()), without(scored_config());
  with.update(p.k(), p.v(), p.q());
  without.update(p.k(), p.v());
  for (int64_t r = 0; r < H; ++r) EXPECT_TRUE(contains(anchors_of(with, r), p.target[r])) << "row " << r;
  EXPECT_NE(bits_of(with.fetch().keys), bits_of(without.fetch().keys));
  EXPECT_EQ(with.nbytes(), internal::unlocked_state(with).buffer_bytes());

  // The cache hands the compressor exactly the queries it was given (the
  // test data is fp16-representable, as the cache stages it).
  compress::SegmentInput in{B, H, S, D, p.K.data(), p.V.data()};
  in.Q = p.Q.data();
  in.G = G;
  in.W = W;
  const auto analysis = compress::analyze_reference(in, scored_config());
  for (int64_t r = 0; r < H; ++r) EXPECT_EQ(anchors_of(with, r), analysis[r].anchors);
}

TEST(ObservationQueries, ChunkedPrefillScoresWithTheLastChunksQueries) {
  const Prefill p;
  AnchorKVConfig cfg = scored_config();
  cfg.trigger = CompressTrigger::kFirstDecode;
  AnchorKVCache chunked(cfg), one_call(scored_config());
  // An early chunk's queries are superseded by the last chunk's.
  std::vector<float> other(p.Q.size(), 0.5f);
  chunked.update(p.k(0, 150), p.v(0, 150), TensorView::f32(other.data(), {B, H * G, W, D}));
  chunked.update(p.k(150, S - 150), p.v(150, S - 150), p.q());
  EXPECT_FALSE(chunked.is_compressed());
  chunked.update(p.k(0, 1), p.v(0, 1));  // first decode: compresses the 400 tokens
  one_call.update(p.k(), p.v(), p.q());
  for (int64_t r = 0; r < H; ++r) EXPECT_EQ(anchors_of(chunked, r), anchors_of(one_call, r));

  // A later chunk without queries drops the pending ones: scoring falls back to proxies.
  AnchorKVCache dropped(cfg), proxies(scored_config());
  dropped.update(p.k(0, 150), p.v(0, 150), p.q());
  dropped.update(p.k(150, S - 150), p.v(150, S - 150));
  dropped.compress_now();
  proxies.update(p.k(), p.v());
  for (int64_t r = 0; r < H; ++r) EXPECT_EQ(anchors_of(dropped, r), anchors_of(proxies, r));
}

TEST(ObservationQueries, SnapKVKeepsWhatTheQueriesAttend) {
  const Prefill p;
  SnapKVCache with(0.05, W, 1), without(0.05, W, 1);
  with.update(p.k(), p.v(), p.q());
  without.update(p.k(), p.v());
  const KVPair kept = with.fetch();
  const int64_t n = kept.keys.shape()[2];
  EXPECT_EQ(n, 20);
  for (int64_t r = 0; r < H; ++r) {
    bool found = false;
    for (int64_t i = 0; i < n && !found; ++i) {
      found = true;
      for (int64_t d = 0; d < D; ++d)
        found = found && kept.keys.at(0, r, i, d) == p.K[(r * S + p.target[r]) * D + d];
    }
    EXPECT_TRUE(found) << "row " << r << " dropped the attended token";
  }
  EXPECT_NE(bits_of(kept.keys), bits_of(without.fetch().keys));
}

TEST(ObservationQueries, H2OAccumulatesTheRealQueries) {
  const Prefill p;
  H2OCache with(0.05), without(0.05);
  with.update(p.k(), p.v(), p.q());
  without.update(p.k(), p.v());
  EXPECT_NE(bits_of(with.fetch().keys), bits_of(without.fetch().keys));
  // Decode with a query (W = 1) is accepted and keeps the size constant.
  const int64_t kept = with.tokens_kept();
  std::vector<float> q1(p.Q.begin(), p.Q.begin() + B * H * G * D);
  with.update(p.k(0, 1), p.v(0, 1), TensorView::f32(q1.data(), {B, H * G, 1, D}));
  EXPECT_EQ(with.tokens_kept(), kept);
}

TEST(ObservationQueries, CachesThatDoNotRankTokensIgnoreThem) {
  const Prefill p;
  FullKVCache a, b;
  a.update(p.k(), p.v(), p.q());
  b.update(p.k(), p.v());
  EXPECT_EQ(bits_of(a.fetch().keys), bits_of(b.fetch().keys));
  QuantizedKVCache qa, qb;
  qa.update(p.k(), p.v(), p.q());
  qb.update(p.k(), p.v());
  EXPECT_EQ(bits_of(qa.fetch().keys), bits_of(qb.fetch().keys));
}

TEST(ObservationQueries, BadQueriesAreRejectedAndChangeNothing) {
  const Prefill p;
  AnchorKVCache c(scored_config());
  auto expect_rejected = [&](const TensorView& q, ErrorCode code, const char* what) {
    try {
      c.update(p.k(), p.v(), q);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("AnchorKVCache::update"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.offset(), 0) << what;
  };
  std::vector<float> q(p.Q);
  expect_rejected(TensorView::f32(q.data(), {B, 3, W, D}), ErrorCode::kShapeMismatch, "Hq not a multiple of H");
  expect_rejected(TensorView::f32(q.data(), {B, H * G, W, D / 2}), ErrorCode::kShapeMismatch, "another D");
  std::vector<float> big(static_cast<size_t>(B * H * (S + 1) * D), 0.0f);
  expect_rejected(TensorView::f32(big.data(), {B, H, S + 1, D}), ErrorCode::kShapeMismatch, "W > S");
  q[5] = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(TensorView::f32(q.data(), {B, H * G, W, D}), ErrorCode::kNonFinite, "NaN");
  c.update(p.k(), p.v(), p.q());
  EXPECT_TRUE(c.is_compressed());
}

TEST(ObservationQueries, CacheSpecsNameThem) {
  const cache::CacheSpec a = cache::parse_cache_spec("anchorkv_compact:pre:obs");
  EXPECT_TRUE(a.pre_rope && a.observe);
  EXPECT_EQ(a.observation_window(), AnchorKVConfig{}.window);
  EXPECT_EQ(cache::parse_cache_spec("anchorkv_compact:obs:pre").observation_window(), AnchorKVConfig{}.window);
  EXPECT_EQ(cache::parse_cache_spec("anchorkv").observation_window(), 0);
  EXPECT_EQ(cache::parse_cache_spec("snapkv:obs").observation_window(), 32);
  EXPECT_EQ(cache::parse_cache_spec("h2o:obs").observation_window(), -1);  // every position, as H2O accumulates
  for (const char* bad : {"full:obs", "kivi2:obs", "streamingllm:obs", "anchorkv:obs:obs", "anchorkv:fast",
                          "snapkv:pre:obs", "anchorkv:"})
    EXPECT_THROW(cache::parse_cache_spec(bad), Error) << bad;
  EXPECT_NE(cache::cache_modifier_help().find(":obs"), std::string::npos);
  // :auto tunes AnchorKV's anchor count; caches without anchors refuse it.
  const cache::CacheSpec t = cache::parse_cache_spec("anchorkv_compact:auto:pre");
  EXPECT_TRUE(t.auto_anchors && t.pre_rope && !t.observe);
  auto made = t.make(0.1, 1);
  EXPECT_EQ(dynamic_cast<AnchorKVCache&>(*made).config().anchor_count, AnchorCount::kAuto);
  EXPECT_EQ(dynamic_cast<AnchorKVCache&>(*cache::parse_cache_spec("anchorkv").make(0.1, 1)).config().anchor_count,
            AnchorCount::kFixed);
  for (const char* bad : {"snapkv:auto", "full:auto", "anchorkv:auto:auto"})
    EXPECT_THROW(cache::parse_cache_spec(bad), Error) << bad;
  // :keyrope: AnchorKV with pre-RoPE keys only.
  EXPECT_TRUE(cache::parse_cache_spec("anchorkv_tight:pre:obs:auto:keyrope").key_rope);
  EXPECT_FALSE(cache::parse_cache_spec("anchorkv_tight:pre").key_rope);
  for (const char* bad : {"anchorkv:keyrope", "full:pre:keyrope", "quantized4:pre:keyrope", "anchorkv:pre:keyrope:keyrope"})
    EXPECT_THROW(cache::parse_cache_spec(bad), Error) << bad;
  EXPECT_NE(cache::cache_modifier_help().find(":keyrope"), std::string::npos);
  // :fp32: AnchorKV kinds only, once.
  EXPECT_TRUE(cache::parse_cache_spec("anchorkv_tight:pre:fp32").fp32_arithmetic);
  EXPECT_FALSE(cache::parse_cache_spec("anchorkv_tight:pre").fp32_arithmetic);
  for (const char* bad : {"full:fp32", "kivi2:fp32", "anchorkv:fp32:fp32"})
    EXPECT_THROW(cache::parse_cache_spec(bad), Error) << bad;
  EXPECT_NE(cache::cache_modifier_help().find(":fp32"), std::string::npos);
}

}  // namespace
}  // namespace anchorkv
