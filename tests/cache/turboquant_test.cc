// TurboQuant: the quantizer's distortion against the Lloyd-Max figures, the
// byte count, the outlier split, attention on the codes against dense
// attention over the reconstruction (and the kernel against its scalar
// twin), sessions that keep coding, files, and the registry's spec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../test_util.h"
#include "attention_on_codes.h"
#include "anchorkv/anchorkv.h"
#include "anchorkv/baselines.h"
#include "anchorkv/cachefile.h"
#include "cache/registry.h"
#include "compress/token_coder.h"
#include "core/rng.h"

namespace anchorkv {
namespace {

using testing_util::random_kv;

std::vector<float> gaussian(int64_t n, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x)
    v = static_cast<float>(std::sqrt(-2.0 * std::log(std::max(rng.uniform(), 1e-300))) *
                           std::cos(6.283185307179586 * rng.uniform()));
  return x;
}

// Mean of ||x - x^||^2 / ||x||^2 over n Gaussian vectors of dimension D.
double relative_mse(const compress::TokenCoder& coder, int64_t D, int64_t n, const std::vector<float>& x) {
  const auto order = compress::choose_wide_channels(x.data(), n, D, coder.wide_channels());
  std::vector<uint8_t> c0(static_cast<size_t>(coder.code_bytes(0))), c1(coder.groups() > 1 ? coder.code_bytes(1) : 1);
  uint8_t* codes[2] = {c0.data(), c1.data()};
  uint16_t scales[2] = {0, 0};
  std::vector<float> scratch(static_cast<size_t>(4 * D)), y(static_cast<size_t>(D));
  double sum = 0;
  for (int64_t t = 0; t < n; ++t) {
    coder.encode(&x[t * D], order.data(), codes, scales, scratch.data());
    const uint8_t* cc[2] = {c0.data(), c1.data()};
    coder.decode(cc, scales, order.data(), y.data(), scratch.data());
    double err = 0, norm = 0;
    for (int64_t d = 0; d < D; ++d) {
      err += (x[t * D + d] - y[d]) * (x[t * D + d] - y[d]);
      norm += x[t * D + d] * x[t * D + d];
    }
    sum += err / norm;
  }
  return sum / static_cast<double>(n);
}

TEST(TokenCoder, DistortionIsTheLloydMaxFigureOfEachWidth) {
  // MSE of the Lloyd-Max quantizer of N(0, 1) (Max, 1960): what rotated
  // coordinates of a vector scaled by its RMS should show.
  const double lloyd_max[] = {0.3634, 0.1175, 0.03454, 0.009497};
  for (int64_t D : {64, 128, 96}) {  // 96: the dense rotation
    const int64_t n = 300;
    const auto x = gaussian(n * D, 7 + D);
    for (int bits = 1; bits <= 4; ++bits) {
      const compress::TokenCoder coder(D, 4 * bits, 11);
      EXPECT_EQ(coder.groups(), 1);
      EXPECT_EQ(coder.token_bytes(), D * bits / 8 + 2);
      const double mse = relative_mse(coder, D, n, x);
      EXPECT_GT(mse, 0.85 * lloyd_max[bits - 1]) << D << " " << bits;
      EXPECT_LT(mse, 1.15 * lloyd_max[bits - 1]) << D << " " << bits;
    }
  }
}

TEST(TokenCoder, FractionalWidthsGiveTheLargestChannelsOneBitMore) {
  const int64_t D = 128, n = 200;
  auto x = gaussian(n * D, 3);
  for (int64_t t = 0; t < n; ++t)  // channels 3, 10, 17, ... are four times as large
    for (int64_t d = 3; d < D; d += 7) x[t * D + d] *= 4;
  const compress::TokenCoder coder(D, 10, 5);  // 2.5 bits
  ASSERT_EQ(coder.groups(), 2);
  EXPECT_EQ(coder.wide_channels(), 64);
  EXPECT_EQ(coder.token_bytes(), 64 * 2 / 8 + 2 + 64 * 3 / 8 + 2);
  const auto order = compress::choose_wide_channels(x.data(), n, D, 64);
  EXPECT_TRUE(compress::valid_channel_order(order.data(), D, 64));
  std::vector<bool> wide(D, false);
  for (int64_t i = D - 64; i < D; ++i) wide[order[i]] = true;
  for (int64_t d = 3; d < D; d += 7) EXPECT_TRUE(wide[d]) << d;
  const double e2 = relative_mse(compress::TokenCoder(D, 8, 5), D, n, x);
  const double e25 = relative_mse(coder, D, n, x);
  const double e3 = relative_mse(compress::TokenCoder(D, 12, 5), D, n, x);
  EXPECT_LT(e25, e2);
  EXPECT_GT(e25, e3);
  std::vector<int32_t> bad = order;
  std::swap(bad[0], bad[1]);  // not ascending within the group
  EXPECT_FALSE(compress::valid_channel_order(bad.data(), D, 64));
  bad = order;
  bad[5] = bad[6];
  EXPECT_FALSE(compress::valid_channel_order(bad.data(), D, 64));
}

TEST(TurboQuantCache, BytesHoldOverASessionAndEveryTokenIsCoded) {
  const int64_t B = 1, H = 2, S = 64, D = 128;
  TurboQuantCache c(4, 3);
  EXPECT_EQ(c.name(), "turboquant:k4v3");
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  c.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  const int64_t per_token = TurboQuantCache::token_side_bytes(D, 4) + TurboQuantCache::token_side_bytes(D, 3);
  EXPECT_EQ(per_token, 66 + 50);
  const int64_t orders = 2 * B * H * D * 4;
  EXPECT_EQ(c.nbytes(), B * H * S * per_token + orders);
  for (int step = 0; step < 10; ++step)  // decode: one token per call, coded too
    c.update(TensorView::f32(&K[step * D], {B, H, 1, D}), TensorView::f32(&V[step * D], {B, H, 1, D}));
  EXPECT_EQ(c.offset(), S + 10);
  EXPECT_EQ(c.nbytes(), B * H * (S + 10) * per_token + orders);
  EXPECT_EQ(c.tokens_kept(), c.tokens_total());
  const auto out = c.fetch().keys.to_f32();  // the decode tokens came back near their keys
  double err = 0, norm = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double x = K[9 * D + d], y = out[(S + 9) * D + d];
    err += (x - y) * (x - y);
    norm += x * x;
  }
  EXPECT_LT(err / norm, 0.02);
  EXPECT_THROW(TurboQuantCache(0.5, 4), Error);
  EXPECT_THROW(TurboQuantCache(4, 2.3), Error);
  EXPECT_THROW(TurboQuantCache(4.25, 4), Error);
}

// Attention on the codes = dense attention over the cache's reconstruction;
// the SIMD kernel = its scalar twin; 1 and 2 threads give the same bits.
TEST(TurboQuantCache, AttendsOnTheCodesAsDenseAttentionOverTheReconstruction) {
  struct Case {
    int64_t D;
    double kb, vb;
  };
  for (const Case& cs : {Case{128, 4, 4}, Case{128, 2.5, 1.75}, Case{64, 3, 2}, Case{80, 1, 1}, Case{96, 3.5, 2}}) {
    const int64_t B = 1, H = 2, S = 700, D = cs.D;
    TurboQuantCache c(cs.kb, cs.vb);
    const auto K = random_kv(B, H, S, D, 3), V = random_kv(B, H, S, D, 4);
    c.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
    testing_util::expect_attention_on_codes(c, 4, "D " + std::to_string(D));
  }
}

TEST(TurboQuantCache, RefusesRopeInsideAttentionAndPreRopeSpecs) {
  const int64_t B = 1, H = 1, S = 16, D = 64;
  TurboQuantCache c(2, 2);
  const auto K = random_kv(B, H, S, D, 1);
  c.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(K.data(), {B, H, S, D}));
  AttentionOptions opt;
  opt.rope.enabled = true;
  try {
    attend(TensorView::f32(K.data(), {B, H, 1, D}), c, opt);
    FAIL() << "RoPE over coded tokens was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  EXPECT_THROW(cache::parse_cache_spec("turboquant:pre"), Error);
}

TEST(TurboQuantCache, FilesRoundTripAndRejectABrokenChannelOrder) {
  const int64_t B = 2, H = 1, S = 40, D = 64;
  TurboQuantCache c(2.5, 3.25);
  const auto K = random_kv(B, H, S, D, 5), V = random_kv(B, H, S, D, 6);
  c.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  auto bytes = serialize_caches({&c});
  auto loaded = load_caches_from_memory(bytes.data(), bytes.size());
  ASSERT_EQ(loaded.caches.size(), 1u);
  EXPECT_EQ(loaded.caches[0]->name(), c.name());
  EXPECT_EQ(testing_util::bits_of(loaded.caches[0]->fetch().keys), testing_util::bits_of(c.fetch().keys));
  EXPECT_EQ(testing_util::bits_of(loaded.caches[0]->fetch().values), testing_util::bits_of(c.fetch().values));
  EXPECT_EQ(loaded.caches[0]->nbytes(), c.nbytes());
  // The first row's key channel order follows the row count: make two entries equal.
  const std::vector<uint8_t> before = bytes;
  bool broke = false;
  for (size_t i = 0; i + 16 < bytes.size() && !broke; ++i) {
    uint64_t n;
    std::memcpy(&n, &bytes[i], 8);
    if (n != static_cast<uint64_t>(D)) continue;  // an array of D channels follows its count
    int32_t ch[3];
    std::memcpy(ch, &bytes[i + 8], 12);
    if (ch[0] == 0 && ch[1] == 1 && ch[2] == 2) {
      std::memcpy(&bytes[i + 12], &ch[0], 4);
      broke = true;
    }
  }
  ASSERT_TRUE(broke);
  try {
    load_caches_from_memory(bytes.data(), bytes.size());
    FAIL() << "a broken channel order loaded";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kCorruptFile) << e.what();
  }
}

TEST(TurboQuantCache, RegistrySpecsSetTheWidths) {
  const auto spec = cache::parse_cache_spec("turboquant:k2.5v2");
  EXPECT_EQ(spec.param, "k2.5v2");
  EXPECT_EQ(spec.make(0.1, 1)->name(), "turboquant:k2.5v2");
  EXPECT_EQ(cache::parse_cache_spec("turboquant").make(0.1, 1)->name(), "turboquant:k4v4");
  for (const char* bad : {"turboquant:k5v2", "turboquant:k2v", "turboquant:kv2", "turboquant:k2v2x", "turboquant:x",
                          "turboquant:k2v2:k3v3", "turboquant:k-1v2", "turboquant:k2.1v2"})
    EXPECT_THROW(cache::parse_cache_spec(bad), Error) << bad;
  EXPECT_THROW(cache::parse_cache_spec("kivi2:k2v2"), Error);
}

}  // namespace
}  // namespace anchorkv
