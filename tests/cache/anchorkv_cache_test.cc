#include <gtest/gtest.h>

#include <cmath>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "compress/anchors.h"
#include "compress/budget.h"

namespace anchorkv {
namespace {

using testing_util::bits_of;
using testing_util::random_kv;

struct Data {
  int64_t B, H, S, D;
  std::vector<float> K, V;
  TensorView k() const { return TensorView::f32(K.data(), {B, H, S, D}); }
  TensorView v() const { return TensorView::f32(V.data(), {B, H, S, D}); }
};

Data make(int64_t B, int64_t H, int64_t S, int64_t D, uint64_t seed = 1) {
  return {B, H, S, D, random_kv(B, H, S, D, seed), random_kv(B, H, S, D, seed + 100)};
}

void expect_invariants(const AnchorKVCache& c) {
  EXPECT_EQ(c.tokens_kept(), c.tokens_total());
  EXPECT_EQ(c.anchorkv_bytes(), internal::unlocked_state(c).buffer_bytes()) << "accounting must equal the stored buffers";
  EXPECT_EQ(c.nbytes(), c.anchorkv_bytes());
  // attention reads each seed-layout row's anchor positions from the state,
  // found once per segment; rows that list them are not copied there
  for (const auto& seg : internal::unlocked_state(c).segments) {
    ASSERT_EQ(seg.anchor_pos.size(), seg.rows.size());
    for (size_t r = 0; r < seg.rows.size(); ++r) {
      const bool lists = seg.rows[r].lists_positions();
      EXPECT_EQ(seg.anchor_pos[r], lists ? std::vector<int32_t>{} : seg.rows[r].anchor_positions()) << "row " << r;
    }
  }
}

TEST(AnchorKVCache, HandComputedBytesAtDefaults) {
  // B=1, H=1, S=4096, D=128: 32 anchors, N = 689 residuals (344 K + 345 V).
  const Data d = make(1, 1, 4096, 128);
  AnchorKVCache c;
  auto out = c.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(out.keys.shape(), (Shape4{1, 1, 4096, 128}));
  EXPECT_EQ(c.n_anchor_total(), 32);
  EXPECT_EQ(c.n_residual_total(), 689);
  EXPECT_EQ(c.anchorkv_bytes(), 32 * 512 + 4064 * 16 + 689 * 34);
  EXPECT_EQ(c.full_seq_bytes(), 4096 * 128 * 4);
  EXPECT_GT(c.compression_ratio(), 1.0);
  EXPECT_NEAR(c.compression_ratio(), 2097152.0 / 104834.0, 1e-9);
  EXPECT_FALSE(c.is_trimmable());
  expect_invariants(c);
}

TEST(AnchorKVCache, TightMetadataBytesByHandAndCloserThanCompact) {
  // Tight: base = 32 * (512 + 4) + 4064 * 4 + 2 = 32770; N = floor((104857.6 - 32770) / 34) = 2120.
  const Data d = make(1, 1, 4096, 128);
  AnchorKVConfig cfg;
  cfg.metadata = MetadataLayout::kTight;
  AnchorKVCache c(cfg);
  const auto out = c.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(c.n_residual_total(), 2120);
  EXPECT_EQ(c.anchorkv_bytes(), 32770 + 2120 * 34);
  expect_invariants(c);
  const compress::CompressedRow& row = internal::unlocked_state(c).segments.front().rows[0];
  EXPECT_EQ(row.layout, MetadataLayout::kTight);
  EXPECT_EQ(row.meta16.size(), 4064u);
  // 8-bit coefficients cost less than the residuals they buy: closer than compact at the same theta.
  cfg.metadata = MetadataLayout::kCompact;
  AnchorKVCache compact(cfg);
  const auto oc = compact.update_and_fetch(d.k(), d.v());
  double et = 0, ec = 0;
  const auto kt = out.keys.to_f32(), kc = oc.keys.to_f32(), vt = out.values.to_f32(), vc = oc.values.to_f32();
  for (size_t i = 0; i < kt.size(); ++i) {
    et += (kt[i] - d.K[i]) * (kt[i] - d.K[i]) + (vt[i] - d.V[i]) * (vt[i] - d.V[i]);
    ec += (kc[i] - d.K[i]) * (kc[i] - d.K[i]) + (vc[i] - d.V[i]) * (vc[i] - d.V[i]);
  }
  EXPECT_LT(et, ec);
  // A segment past 256 * 128 tokens keeps at most 256 anchors instead of failing.
  const Data big = make(1, 1, 40000, 16);
  cfg.metadata = MetadataLayout::kTight;
  AnchorKVCache longer(cfg);
  longer.update(big.k(), big.v());
  EXPECT_EQ(longer.n_anchor_total(), compress::kMaxTightAnchors);
  expect_invariants(longer);
}

TEST(AnchorKVCache, CompactMetadataBytesByHandAndLossless) {
  // Compact: base = 32 * (512 + 4) + 4064 * 8 = 49024; N = floor((104857.6 - 49024) / 34) = 1642.
  const Data d = make(1, 1, 4096, 128);
  AnchorKVConfig cfg;
  cfg.metadata = MetadataLayout::kCompact;
  AnchorKVCache c(cfg);
  const auto out = c.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(c.n_residual_total(), 1642);
  EXPECT_EQ(c.anchorkv_bytes(), 49024 + 1642 * 34);
  expect_invariants(c);
  // The same anchors as the seed layout, recovered from the stored positions.
  AnchorKVCache seed;
  seed.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(internal::unlocked_state(c).segments.front().rows[0].anchor_positions(), internal::unlocked_state(seed).segments.front().rows[0].anchor_positions());
  // More residuals for the same budget: a closer reconstruction.
  const auto ks = seed.fetch().keys.to_f32(), kc = out.keys.to_f32();
  double es = 0, ec = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    es += (ks[i] - d.K[i]) * (ks[i] - d.K[i]);
    ec += (kc[i] - d.K[i]) * (kc[i] - d.K[i]);
  }
  EXPECT_LT(ec, es);
  // Every token an anchor: lossless in the compact layout too.
  cfg.anchor_frac = 1.0;
  AnchorKVCache all(cfg);
  FullKVCache f;
  const Data e = make(2, 2, 100, 64);
  EXPECT_EQ(bits_of(all.update_and_fetch(e.k(), e.v()).keys), bits_of(f.update_and_fetch(e.k(), e.v()).keys));
  expect_invariants(all);
  // Decode after a compact prefill is exact.
  const Data t = make(1, 1, 1, 128, 7);
  const auto o2 = c.update_and_fetch(t.k(), t.v());
  EXPECT_EQ(o2.keys.at(0, 0, 4096, 5), t.K[5]);
  expect_invariants(c);
}

TEST(AnchorKVCache, PooledBudgetAcrossHeadsByHand) {
  // B=2, H=3, S=256, D=64, anchor_frac 1/16 -> 16 anchors per row, theta 0.2.
  // Per batch element: full = 3*256*64*4 = 196608, base = 3*(16*256 + 240*16) = 23808,
  // N = floor((0.2*196608 - 23808) / 18) = floor(15513.6/18) = 861.
  const Data d = make(2, 3, 256, 64);
  AnchorKVConfig cfg;
  cfg.anchor_frac = 1.0 / 16;
  cfg.theta = 0.2;
  AnchorKVCache c(cfg);
  c.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(c.n_anchor_total(), 6 * 16);
  EXPECT_EQ(c.n_residual_total(), 2 * 861);
  EXPECT_EQ(c.anchorkv_bytes(), 2 * (23808 + 861 * 18));
  int64_t k_res = 0;
  for (const auto& row : internal::unlocked_state(c).segments.front().rows) k_res += row.k.n_residual();
  EXPECT_EQ(k_res, 2 * 430);
  // Per-head allocation: N per row = floor((0.2*65536 - 7936) / 18) = 287.
  cfg.allocation = ResidualAllocation::kPerHead;
  AnchorKVCache p(cfg);
  p.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(p.n_residual_total(), 6 * 287);
  for (const auto& row : internal::unlocked_state(p).segments.front().rows) EXPECT_EQ(row.n_residual(), 287);
  expect_invariants(c);
  expect_invariants(p);
}

TEST(AnchorKVCache, DecodeAfterPrefillIsExact) {
  const Data d = make(2, 2, 300, 64);
  AnchorKVCache c;
  c.update_and_fetch(d.k(), d.v());
  const int64_t bytes_after_prefill = c.anchorkv_bytes();
  const Data t = make(2, 2, 1, 64, 77);
  auto out = c.update_and_fetch(t.k(), t.v());
  ASSERT_EQ(out.keys.shape(), (Shape4{2, 2, 301, 64}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t x = 0; x < 64; ++x) {
        EXPECT_EQ(out.keys.at(b, h, 300, x), t.K[(b * 2 + h) * 64 + x]);
        EXPECT_EQ(out.values.at(b, h, 300, x), t.V[(b * 2 + h) * 64 + x]);
      }
  EXPECT_EQ(c.anchorkv_bytes(), bytes_after_prefill + 2 * 2 * 64 * 4);
  EXPECT_EQ(c.offset(), 301);
  // A multi-token call after the prefill is appended exactly too (never re-anchored).
  const Data t2 = make(2, 2, 5, 64, 78);
  out = c.update_and_fetch(t2.k(), t2.v());
  EXPECT_EQ(out.keys.at(1, 1, 305, 63), t2.K[(3 * 5 + 4) * 64 + 63]);
  EXPECT_EQ(c.tokens_total(), 4 * 306);
  expect_invariants(c);
}

TEST(AnchorKVCache, FirstCallWithOneTokenIsExactThenPrefillCompresses) {
  const Data one = make(1, 2, 1, 32, 5);
  AnchorKVCache c;
  auto out = c.update_and_fetch(one.k(), one.v());
  EXPECT_FALSE(c.is_compressed());
  EXPECT_EQ(out.keys.at(0, 1, 0, 3), one.K[32 + 3]);
  const Data pre = make(1, 2, 200, 32, 6);
  out = c.update_and_fetch(pre.k(), pre.v());
  EXPECT_TRUE(c.is_compressed());
  EXPECT_EQ(internal::unlocked_state(c).compressed_tokens(), 200);
  EXPECT_EQ(out.keys.shape(), (Shape4{1, 2, 201, 32}));
  EXPECT_EQ(out.keys.at(0, 1, 0, 3), one.K[32 + 3]);  // the head stays exact
  expect_invariants(c);
}

TEST(AnchorKVCache, EdgeShapesAndSettings) {
  struct E {
    const char* what;
    int64_t S, D;
    AnchorKVConfig cfg;
  };
  std::vector<E> cases;
  cases.push_back({"S=2", 2, 64, {}});
  cases.push_back({"S<window", 20, 64, {}});
  AnchorKVConfig w0;
  w0.window = 0;
  cases.push_back({"window=0", 300, 64, w0});
  AnchorKVConfig r0, r1;
  r0.rho = 0;
  r0.anchor_frac = 0.1;
  r1.rho = 1;
  r1.anchor_frac = 0.1;
  cases.push_back({"rho=0", 600, 64, r0});
  cases.push_back({"rho=1", 600, 64, r1});
  for (int64_t D : {17, 80, 96, 128}) cases.push_back({"D", 300, D, {}});
  for (const E& e : cases) {
    SCOPED_TRACE(std::string(e.what) + " S=" + std::to_string(e.S) + " D=" + std::to_string(e.D));
    const Data d = make(2, 2, e.S, e.D);
    AnchorKVCache c(e.cfg);
    auto out = c.update_and_fetch(d.k(), d.v());
    EXPECT_EQ(out.keys.shape(), (Shape4{2, 2, e.S, e.D}));
    EXPECT_TRUE(c.is_compressed());
    const int64_t k = compress::plan_anchors(e.S, e.cfg).k;
    EXPECT_EQ(c.n_anchor_total(), 4 * k);
    // Anchors come back exactly.
    for (int64_t r = 0; r < 4; ++r)
      for (int32_t p : internal::unlocked_state(c).segments.front().rows[r].anchor_positions())
        for (int64_t x = 0; x < e.D; ++x) ASSERT_EQ(out.keys.at(r / 2, r % 2, p, x), d.K[(r * e.S + p) * e.D + x]);
    expect_invariants(c);
  }
}

TEST(AnchorKVCache, ThetaZeroHasNoResidualsAndThetaOneGivesEveryTokenOne) {
  const Data d = make(1, 2, 300, 64);
  AnchorKVConfig t0;
  t0.theta = 0;
  AnchorKVCache a(t0);
  a.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(a.n_residual_total(), 0);
  AnchorKVConfig t1;
  t1.theta = 1;
  AnchorKVCache b(t1);
  b.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(b.n_residual_total(), 2 * 2 * (300 - b.n_anchor_total() / 2));
  expect_invariants(a);
  expect_invariants(b);
}

TEST(AnchorKVCache, AnchorFracOneIsLossless) {
  const Data d = make(2, 3, 150, 80);
  AnchorKVConfig cfg;
  cfg.anchor_frac = 1.0;
  AnchorKVCache c(cfg);
  FullKVCache f;
  const auto a = c.update_and_fetch(d.k(), d.v());
  const auto b = f.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(bits_of(a.keys), bits_of(b.keys));
  EXPECT_EQ(bits_of(a.values), bits_of(b.values));
  EXPECT_EQ(c.n_anchor_total(), 6 * 150);
  EXPECT_EQ(c.anchorkv_bytes(), f.nbytes());
  expect_invariants(c);
}

TEST(AnchorKVCache, RatioAboveOneAtDefaultsAndFallsAsThetaGrows) {
  const Data d = make(1, 1, 4096, 128, 9);
  double prev = 1e30;
  for (double theta : {0.03, 0.05, 0.1, 0.15}) {  // below saturation (every token a residual at ~0.19)
    AnchorKVConfig cfg;
    cfg.theta = theta;
    AnchorKVCache c(cfg);
    c.update_and_fetch(d.k(), d.v());
    if (theta == 0.05) {
      EXPECT_GT(c.compression_ratio(), 1.0);
    }
    EXPECT_LT(c.compression_ratio(), prev) << theta;
    prev = c.compression_ratio();
    expect_invariants(c);
  }
}

TEST(AnchorKVCache, MoreBudgetMeansSmallerReconstructionError) {
  const Data d = make(1, 2, 1024, 64, 10);
  double prev = 1e30;
  for (double theta : {0.05, 0.1, 0.15, 0.2}) {  // below saturation
    AnchorKVConfig cfg;
    cfg.theta = theta;
    AnchorKVCache c(cfg);
    const auto out = c.update_and_fetch(d.k(), d.v());
    const auto k = out.keys.to_f32();
    double err = 0;
    for (size_t i = 0; i < k.size(); ++i) err += (k[i] - d.K[i]) * (k[i] - d.K[i]);
    EXPECT_LT(err, prev) << theta;
    prev = err;
  }
}

TEST(AnchorKVCache, DtypesAndStridesGiveTheSameResult) {
  const Data d = make(1, 2, 100, 32);
  AnchorKVCache a;
  const auto ref = a.update_and_fetch(d.k(), d.v());
  // fp16 input.
  std::vector<uint16_t> k16(d.K.size()), v16(d.V.size());
  for (size_t i = 0; i < k16.size(); ++i) {
    k16[i] = f32_to_fp16(d.K[i]);
    v16[i] = f32_to_fp16(d.V[i]);
  }
  AnchorKVCache b;
  const auto o16 = b.update_and_fetch(TensorView::f16(k16.data(), {1, 2, 100, 32}),
                                      TensorView::f16(v16.data(), {1, 2, 100, 32}));
  EXPECT_EQ(bits_of(ref.keys), bits_of(o16.keys));
  EXPECT_EQ(bits_of(ref.values), bits_of(o16.values));
  // Non-contiguous: data laid out [B, S, H, D] and viewed as [B, H, S, D].
  std::vector<float> kt(d.K.size()), vt(d.V.size());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 100; ++s)
      for (int64_t x = 0; x < 32; ++x) {
        kt[(s * 2 + h) * 32 + x] = d.K[(h * 100 + s) * 32 + x];
        vt[(s * 2 + h) * 32 + x] = d.V[(h * 100 + s) * 32 + x];
      }
  TensorView kv{kt.data(), DType::kF32, {1, 2, 100, 32}, {2 * 100 * 32, 32, 64, 1}};
  TensorView vv{vt.data(), DType::kF32, {1, 2, 100, 32}, {2 * 100 * 32, 32, 64, 1}};
  EXPECT_FALSE(kv.is_contiguous());
  AnchorKVCache c;
  const auto ot = c.update_and_fetch(kv, vv);
  EXPECT_EQ(bits_of(ref.keys), bits_of(ot.keys));
  // bf16 input (values that bf16 holds exactly).
  std::vector<uint16_t> kb(d.K.size());
  std::vector<float> kr(d.K.size());
  for (size_t i = 0; i < kb.size(); ++i) {
    kb[i] = static_cast<uint16_t>(core::f32_bits(d.K[i]) >> 16);
    kr[i] = core::bf16_to_float(kb[i]);
  }
  AnchorKVCache e, g;
  const auto ob = e.update_and_fetch(TensorView::bf16(kb.data(), {1, 2, 100, 32}), d.v());
  const auto orr = g.update_and_fetch(TensorView::f32(kr.data(), {1, 2, 100, 32}), d.v());
  EXPECT_EQ(bits_of(ob.keys), bits_of(orr.keys));
}

TEST(AnchorKVCache, DeterministicAcrossInstancesAndThreads) {
  const Data d = make(2, 4, 700, 64);
  AnchorKVConfig c1, c2;
  c1.threads = 1;
  c2.threads = 2;
  AnchorKVCache a(c1), b(c2), e(c2);
  const auto x = a.update_and_fetch(d.k(), d.v());
  const auto y = b.update_and_fetch(d.k(), d.v());
  const auto z = e.update_and_fetch(d.k(), d.v());
  EXPECT_EQ(bits_of(x.keys), bits_of(y.keys));
  EXPECT_EQ(bits_of(x.values), bits_of(y.values));
  EXPECT_EQ(bits_of(y.keys), bits_of(z.keys));
  AnchorKVConfig c3;
  c3.seed = 43;
  c3.anchor_frac = 1.0 / 16;
  c1.anchor_frac = 1.0 / 16;
  AnchorKVCache f(c1), g(c3);
  EXPECT_NE(bits_of(f.update_and_fetch(d.k(), d.v()).keys), bits_of(g.update_and_fetch(d.k(), d.v()).keys));
}

TEST(AnchorKVCache, ChunkedPrefillCompressesEverythingAtFirstDecode) {
  const Data c1 = make(1, 2, 100, 32, 1), c2 = make(1, 2, 100, 32, 2), tok = make(1, 2, 1, 32, 3);
  // Seed behaviour: only the first chunk is compressed.
  AnchorKVCache seed;
  seed.update_and_fetch(c1.k(), c1.v());
  seed.update_and_fetch(c2.k(), c2.v());
  EXPECT_EQ(internal::unlocked_state(seed).compressed_tokens(), 100);
  EXPECT_EQ(internal::unlocked_state(seed).tail.tokens, 100);
  // Chunked: both chunks stay exact until the first decode step, then compress together.
  AnchorKVConfig cfg;
  cfg.trigger = CompressTrigger::kFirstDecode;
  AnchorKVCache chunked(cfg);
  auto out = chunked.update_and_fetch(c1.k(), c1.v());
  EXPECT_FALSE(chunked.is_compressed());
  EXPECT_EQ(out.keys.at(0, 1, 99, 31), c1.K[(100 + 99) * 32 + 31]);
  chunked.update_and_fetch(c2.k(), c2.v());
  EXPECT_FALSE(chunked.is_compressed());
  EXPECT_EQ(chunked.anchorkv_bytes(), chunked.full_seq_bytes());
  out = chunked.update_and_fetch(tok.k(), tok.v());
  EXPECT_TRUE(chunked.is_compressed());
  EXPECT_EQ(internal::unlocked_state(chunked).compressed_tokens(), 200);
  EXPECT_EQ(internal::unlocked_state(chunked).tail.tokens, 1);
  EXPECT_EQ(out.keys.shape(), (Shape4{1, 2, 201, 32}));
  EXPECT_EQ(out.keys.at(0, 1, 200, 5), tok.K[32 + 5]);
  expect_invariants(chunked);
  // The same as compressing the concatenation in one prefill.
  std::vector<float> K, V;
  for (int64_t h = 0; h < 2; ++h) {
    K.insert(K.end(), c1.K.begin() + h * 3200, c1.K.begin() + (h + 1) * 3200);
    K.insert(K.end(), c2.K.begin() + h * 3200, c2.K.begin() + (h + 1) * 3200);
    V.insert(V.end(), c1.V.begin() + h * 3200, c1.V.begin() + (h + 1) * 3200);
    V.insert(V.end(), c2.V.begin() + h * 3200, c2.V.begin() + (h + 1) * 3200);
  }
  AnchorKVCache whole;
  const auto w = whole.update_and_fetch(TensorView::f32(K.data(), {1, 2, 200, 32}), TensorView::f32(V.data(), {1, 2, 200, 32}));
  const auto chunked_out = chunked.fetch();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 200; ++s)
      for (int64_t x = 0; x < 32; ++x) ASSERT_EQ(w.keys.at(0, h, s, x), chunked_out.keys.at(0, h, s, x));
}

TEST(AnchorKVCache, CompressNow) {
  AnchorKVConfig cfg;
  cfg.trigger = CompressTrigger::kFirstDecode;
  AnchorKVCache c(cfg);
  EXPECT_THROW(c.compress_now(), Error);  // nothing to compress
  const Data d = make(1, 1, 64, 16);
  c.update_and_fetch(d.k(), d.v());
  c.compress_now();
  EXPECT_TRUE(c.is_compressed());
  EXPECT_EQ(internal::unlocked_state(c).compressed_tokens(), 64);
  expect_invariants(c);
  try {
    c.compress_now();
    FAIL() << "second compress_now must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("compress_now"), std::string::npos);
  }
}

}  // namespace
}  // namespace anchorkv
