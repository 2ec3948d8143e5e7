#include "compress/compressor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "../test_util.h"
#include "compress/anchors.h"
#include "compress/budget.h"
#include "core/half.h"
#include "core/rope.h"

namespace anchorkv::compress {
namespace {

using testing_util::random_kv;

// Reconstructions of the fast and reference paths agree to this absolute
// error per coordinate, relative to the token's largest coordinate: both decode
// the same codes, but gamma and the codec's scale come from sums taken in a
// different order, and fp16 scales may round to neighbouring values.
constexpr double kReconstructionTol = 2e-3;

struct Case {
  int64_t B, H, S, D;
  AnchorKVConfig cfg;
  int64_t G = 0, W = 0;  // real observation queries when W > 0
};

std::vector<Case> cases() {
  std::vector<Case> out;
  AnchorKVConfig base;
  base.theta = 0.1;  // residuals for a minority of tokens: the budget boundary lies among
                     // utilities that float rounding cannot reorder
  base.anchor_frac = 1.0 / 16;
  base.window = 8;
  for (int64_t S : {2, 5, 33, 300, 700})
    for (int64_t D : {17, 64, 80}) out.push_back({2, 3, S, D, base});
  AnchorKVConfig w0 = base;
  w0.window = 0;
  out.push_back({1, 2, 200, 64, w0});
  AnchorKVConfig r0 = base, r1 = base;
  r0.rho = 0;
  r1.rho = 1;
  out.push_back({1, 2, 400, 64, r0});
  out.push_back({1, 2, 400, 64, r1});
  AnchorKVConfig ph = base;
  ph.allocation = ResidualAllocation::kPerHead;
  out.push_back({2, 2, 300, 32, ph});
  AnchorKVConfig compact = base;
  compact.metadata = MetadataLayout::kCompact;
  out.push_back({2, 2, 500, 64, compact});
  AnchorKVConfig tight = base;
  tight.metadata = MetadataLayout::kTight;
  out.push_back({2, 2, 512, 64, tight});
  out.push_back({1, 2, 300, 64, tight, 1, 32});
  AnchorKVConfig b3 = base;
  b3.residual_bits = 3;
  b3.scale = ResidualScale::kAbsMax;
  out.push_back({1, 2, 300, 96, b3});
  for (int64_t S : {5, 300, 700}) out.push_back({2, 2, S, 64, base, 2, std::min<int64_t>(S, 8)});
  out.push_back({1, 2, 400, 64, r1, 4, 1});
  out.push_back({1, 2, 300, 64, compact, 1, 32});
  AnchorKVConfig autok = compact;
  autok.anchor_count = AnchorCount::kAuto;
  autok.anchor_frac = 1.0 / 64;
  autok.theta = 0.2;
  out.push_back({1, 2, 640, 64, autok, 2, 8});
  AnchorKVConfig autot = autok;
  autot.metadata = MetadataLayout::kTight;
  out.push_back({1, 2, 640, 64, autot, 2, 8});
  return out;
}

TEST(Compressor, FastPathMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " H=" << c.H << " S=" << c.S << " D=" << c.D << " "
                                      << c.cfg.to_string());
    const auto K = random_kv(c.B, c.H, c.S, c.D, 1);
    const auto V = random_kv(c.B, c.H, c.S, c.D, 2);
    const auto Q = random_kv(c.B, c.H * c.G, c.W, c.D, 7);
    SegmentInput in{c.B, c.H, c.S, c.D, K.data(), V.data()};
    if (c.W > 0) {
      in.Q = Q.data();
      in.G = c.G;
      in.W = c.W;
    }
    const auto ref = analyze_reference(in, c.cfg);
    AnchorKVConfig cfg2 = c.cfg;
    cfg2.threads = 2;
    const auto fast = analyze(in, cfg2);
    ASSERT_EQ(ref.size(), fast.size());
    for (size_t r = 0; r < ref.size(); ++r) {
      // Utilities agree relative to their own size or to the row's largest
      // (tiny ones come from cancellation in q . r and differ more).
      float umax = 0;
      for (float u : ref[r].utility.key) umax = std::isinf(u) ? umax : std::max(umax, u);
      ASSERT_EQ(ref[r].anchors, fast[r].anchors) << "row " << r;
      ASSERT_EQ(ref[r].k.anchor, fast[r].k.anchor) << "row " << r;
      ASSERT_EQ(ref[r].v.anchor, fast[r].v.anchor) << "row " << r;
      for (int64_t t = 0; t < c.S; ++t) {
        ASSERT_NEAR(ref[r].k.coef[t], fast[r].k.coef[t], 1e-5 * (1 + std::fabs(ref[r].k.coef[t])));
        ASSERT_NEAR(ref[r].v.coef[t], fast[r].v.coef[t], 1e-5 * (1 + std::fabs(ref[r].v.coef[t])));
        const float uk = ref[r].utility.key[t], fk = fast[r].utility.key[t];
        if (std::isinf(uk)) {
          ASSERT_EQ(uk, fk);
        } else {
          ASSERT_NEAR(uk, fk, 1e-3 * std::fabs(uk) + 1e-5 * umax + 1e-12);
        }
      }
    }
    const auto choice_ref = allocate_residuals(in, c.cfg, ref);
    const auto choice_fast = allocate_residuals(in, c.cfg, fast);
    EXPECT_EQ(choice_ref.k, choice_fast.k);
    EXPECT_EQ(choice_ref.v, choice_fast.v);

    ResidualCodec codec(c.D, c.cfg.residual_bits, c.cfg.scale, c.cfg.seed);
    const auto rows_ref = compress_reference(in, c.cfg, codec);
    const auto rows_fast = compress(in, cfg2, codec);
    for (size_t r = 0; r < rows_ref.size(); ++r) {
      EXPECT_EQ(rows_ref[r].meta, rows_fast[r].meta);
      EXPECT_EQ(rows_ref[r].meta32, rows_fast[r].meta32);
      EXPECT_EQ(rows_ref[r].anchor_pos, rows_fast[r].anchor_pos);
      std::vector<float> k1(c.S * c.D), v1(k1.size()), k2(k1.size()), v2(k1.size());
      reconstruct_row(rows_ref[r], codec, k1.data(), v1.data());
      reconstruct_row(rows_fast[r], codec, k2.data(), v2.data());
      for (int64_t t = 0; t < c.S; ++t) {
        float mk = 0, mv = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          mk = std::max(mk, std::fabs(K[(r * c.S + t) * c.D + d]));
          mv = std::max(mv, std::fabs(V[(r * c.S + t) * c.D + d]));
        }
        for (int64_t d = 0; d < c.D; ++d) {
          ASSERT_NEAR(k1[t * c.D + d], k2[t * c.D + d], kReconstructionTol * mk);
          ASSERT_NEAR(v1[t * c.D + d], v2[t * c.D + d], kReconstructionTol * mv);
        }
      }
    }
  }
}

TEST(Compressor, OutputIsBitIdenticalForAnyThreadCount) {
  const int64_t B = 2, H = 4, S = 1100, D = 64;
  const auto K = random_kv(B, H, S, D, 3);
  const auto V = random_kv(B, H, S, D, 4);
  SegmentInput in{B, H, S, D, K.data(), V.data()};
  AnchorKVConfig cfg;
  cfg.anchor_frac = 1.0 / 32;
  cfg.theta = 0.15;
  ResidualCodec codec(D, cfg.residual_bits, cfg.scale, cfg.seed);
  cfg.threads = 1;
  const auto one = compress(in, cfg, codec);
  for (int threads : {2, 3, 8}) {
    cfg.threads = threads;
    const auto many = compress(in, cfg, codec);
    for (size_t r = 0; r < one.size(); ++r) {
      EXPECT_EQ(one[r].anchor_k, many[r].anchor_k);
      EXPECT_EQ(one[r].anchor_v, many[r].anchor_v);
      EXPECT_EQ(one[r].meta, many[r].meta);
      EXPECT_EQ(one[r].k.coef, many[r].k.coef);
      EXPECT_EQ(one[r].v.coef, many[r].v.coef);
      EXPECT_EQ(one[r].k.codes, many[r].k.codes);
      EXPECT_EQ(one[r].v.codes, many[r].v.codes);
      EXPECT_EQ(one[r].k.scales, many[r].k.scales);
      EXPECT_EQ(one[r].v.scales, many[r].v.scales);
    }
  }
}

// Scored anchors follow the real queries: each row's queries point at the key
// of one position, which the proxies (keys that point nowhere) would not pick.
TEST(Compressor, RealQueriesChooseTheScoredAnchors) {
  const int64_t B = 1, H = 2, S = 256, D = 32, G = 2, W = 4;
  const auto K = random_kv(B, H, S, D, 11, S);  // every token its own direction
  const auto V = random_kv(B, H, S, D, 12);
  std::vector<float> Q(static_cast<size_t>(B * H * G * W * D));
  const int64_t target[] = {37, 150};
  for (int64_t r = 0; r < H; ++r)
    for (int64_t j = 0; j < G * W; ++j)
      for (int64_t d = 0; d < D; ++d) Q[(r * G * W + j) * D + d] = 4.0f * K[(r * S + target[r]) * D + d];
  AnchorKVConfig cfg;
  cfg.anchor_frac = 8.0 / 256;  // k = 8: 4 window anchors, 4 others, all scored
  cfg.window = 4;
  cfg.rho = 1.0;
  SegmentInput in{B, H, S, D, K.data(), V.data()};
  in.Q = Q.data();
  in.G = G;
  in.W = W;
  for (const auto& rows : {analyze(in, cfg), analyze_reference(in, cfg)})
    for (int64_t r = 0; r < H; ++r) {
      const auto& a = rows[r].anchors;
      EXPECT_NE(std::find(a.begin(), a.end(), target[r]), a.end()) << "row " << r;
    }
}

// kAuto tries k0, 2 k0, 4 k0, ... while the anchors and metadata fit theta's
// bytes, keeps the least estimated error, and never exceeds the budget.
TEST(Compressor, AutoAnchorCountFitsTheBudgetAndMinimizesTheEstimate) {
  const int64_t B = 1, H = 2, D = 64;
  int more_anchors = 0;  // cases where the estimate chose more than k0
  for (int64_t S : {512, 2000})
    for (double theta : {0.05, 0.1, 0.2, 0.4})
      for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
        SCOPED_TRACE(::testing::Message() << "S=" << S << " theta=" << theta << " " << to_string(layout));
        const auto K = random_kv(B, H, S, D, 21), V = random_kv(B, H, S, D, 22);
        SegmentInput in{B, H, S, D, K.data(), V.data()};
        AnchorKVConfig cfg;
        cfg.theta = theta;
        cfg.metadata = layout;
        cfg.anchor_count = AnchorCount::kAuto;
        const auto fractions = anchor_fractions(in, cfg);
        ASSERT_GE(fractions.size(), 1u);
        ASSERT_LE(fractions.size(), static_cast<size_t>(kMaxAnchorDoublings + 1));
        const int64_t k0 = plan_anchors(S, cfg).k;
        double best_err = 0;
        int64_t best_k = 0;
        for (size_t i = 0; i < fractions.size(); ++i) {
          AnchorKVConfig c = cfg;
          c.anchor_frac = fractions[i];
          const int64_t k = plan_anchors(S, c).k;
          EXPECT_EQ(k, k0 << i);
          if (i > 0) {
            EXPECT_LE(base_row_bytes(S, k, D, layout), theta * full_row_bytes(S, D));
          }
          const auto a = analyze(in, c);
          const double err = estimated_error(a, allocate_residuals(in, c, a), c.residual_bits);
          if (i == 0 || err < best_err) {
            best_err = err;
            best_k = k;
          }
        }
        ResidualCodec codec(D, cfg.residual_bits, cfg.scale, cfg.seed);
        CompressionStats stats;
        const auto rows = compress(in, cfg, codec, &stats);
        EXPECT_EQ(stats.anchor_counts_tried, static_cast<int64_t>(fractions.size()));
        int64_t bytes = 0;
        for (const auto& row : rows) {
          EXPECT_EQ(row.n_anchor, best_k);
          bytes += base_row_bytes(S, row.n_anchor, D, layout) + row.n_residual() * residual_bytes(D, cfg.residual_bits);
        }
        if (base_row_bytes(S, k0, D, layout) <= theta * full_row_bytes(S, D)) {
          EXPECT_LE(bytes, theta * full_row_bytes(S, D) * B * H);
        }
        more_anchors += best_k > k0;
      }
  EXPECT_GT(more_anchors, 0) << "the estimate never preferred more anchors";
  // Fixed keeps the configured fraction alone.
  AnchorKVConfig fixed;
  const auto K = random_kv(1, 1, 512, 64, 1);
  EXPECT_EQ(anchor_fractions({1, 1, 512, 64, K.data(), K.data()}, fixed), std::vector<double>{fixed.anchor_frac});
}

// The estimate: unallocated utilities count whole, allocated ones times the codec's distortion.
TEST(Compressor, EstimatedErrorByHand) {
  RowAnalysis a;
  const float inf = std::numeric_limits<float>::infinity();
  a.utility.key = {-inf, 4.0f, 2.0f, 1.0f};
  a.utility.value = {-inf, 8.0f, 0.5f, 0.25f};
  ResidualChoice choice;
  choice.k = {{1}};
  choice.v = {{1, 2}};
  const double eps = residual_distortion(2);
  EXPECT_NEAR(eps, 0.1175, 1e-9);
  EXPECT_NEAR(estimated_error({a}, choice, 2), 4 * eps + 2 + 1 + 8 * eps + 0.5 * eps + 0.25, 1e-6);
  EXPECT_GT(residual_distortion(1), residual_distortion(2));
  EXPECT_GT(residual_distortion(3), residual_distortion(4));
}

TEST(Compressor, StorageMatchesSeedFormulaAndAnchorsRecover) {
  const int64_t B = 1, H = 2, S = 500, D = 64;
  const auto K = random_kv(B, H, S, D, 5);
  const auto V = random_kv(B, H, S, D, 6);
  SegmentInput in{B, H, S, D, K.data(), V.data()};
  AnchorKVConfig cfg;
  cfg.theta = 0.3;
  cfg.anchor_frac = 0.05;
  cfg.window = 4;
  ResidualCodec codec(D, 2, cfg.scale, cfg.seed);
  const auto analysis = analyze(in, cfg);
  const auto rows = compress(in, cfg, codec);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    EXPECT_EQ(row.buffer_bytes(), base_row_bytes(S, row.n_anchor, D) + row.n_residual() * residual_bytes(D, 2));
    EXPECT_EQ(row.anchor_positions(), analysis[r].anchors);
    EXPECT_EQ(row.n_anchor, 25);
  }
}

// The slot index gives the K and V residual slots before every block start
// (and before the end), in every layout, at sizes around block boundaries.
TEST(Compressor, ResidualSlotIndexCountsTheFlagsBeforeEachBlock) {
  std::mt19937 g(3);
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight})
    for (int64_t n : {0, 1, 1023, 1024, 1025, 2048, 3000}) {
      CompressedRow row;
      row.layout = layout;
      std::vector<bool> fk(static_cast<size_t>(n)), fv(fk.size());
      for (int64_t e = 0; e < n; ++e) {
        fk[e] = g() % 3 == 0, fv[e] = g() % 5 == 0;
        if (layout == MetadataLayout::kSeed)
          row.meta.push_back(uint64_t{fk[e]} << 60 | uint64_t{fv[e]} << 61);
        else if (layout == MetadataLayout::kCompact)
          row.meta32.push_back(uint32_t{fk[e]} << 15 | uint32_t{fv[e]} << 31);
        else {
          row.meta16.push_back(0);
          row.k.coef8.push_back(fk[e] ? kTightResidual : 0);
          row.v.coef8.push_back(fv[e] ? kTightResidual : 0);
        }
      }
      ASSERT_EQ(row.n_other(), n);
      const std::vector<int64_t> index = residual_slot_index(row);
      const int64_t blocks = (n + kSlotIndexBlock - 1) / kSlotIndexBlock;
      ASSERT_EQ(static_cast<int64_t>(index.size()), 2 * (blocks + 1)) << "n " << n;
      for (int64_t b = 0; b <= blocks; ++b) {
        const int64_t end = std::min(b * kSlotIndexBlock, n);
        EXPECT_EQ(index[2 * b], std::count(fk.begin(), fk.begin() + end, true)) << "n " << n << " block " << b;
        EXPECT_EQ(index[2 * b + 1], std::count(fv.begin(), fv.begin() + end, true)) << "n " << n << " block " << b;
      }
    }
}

// key_rope changes the key residual codes only: each codes RoPE_t(r) at the
// token's position, so rotating the decoded residual back by that position
// recovers r as well as the plain codes do, and reconstruction returns keys
// before RoPE.
TEST(Compressor, KeyRopeCodesKeyResidualsAtTheirPositions) {
  const int64_t B = 1, H = 2, S = 600, D = 64, offset = 7;
  const auto K = random_kv(B, H, S, D, 8);
  const auto V = random_kv(B, H, S, D, 9);
  SegmentInput in{B, H, S, D, K.data(), V.data()};
  AnchorKVConfig plain;
  plain.theta = 0.3;
  plain.anchor_frac = 0.05;
  AnchorKVConfig roped = plain;
  roped.key_rope = {true, 10000.0, RopeStyle::kNeox, offset, {}};
  ResidualCodec codec(D, 2, plain.scale, plain.seed);
  const auto a = compress(in, plain, codec), b = compress(in, roped, codec);
  double err_plain = 0, err_roped = 0, rec_plain = 0, rec_roped = 0;
  int64_t n = 0;
  std::vector<float> za(D), zb(D), ka(S * D), va(S * D), kb(S * D), vb(S * D);
  std::vector<uint8_t> scratch(D);
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_FALSE(a[r].key_rope.enabled);
    ASSERT_TRUE(b[r].key_rope.enabled);
    EXPECT_EQ(a[r].anchor_k, b[r].anchor_k);
    EXPECT_EQ(a[r].meta, b[r].meta);
    EXPECT_EQ(a[r].k.coef, b[r].k.coef);
    EXPECT_EQ(a[r].v.codes, b[r].v.codes);
    ASSERT_EQ(a[r].k.n_residual(), b[r].k.n_residual());
    ASSERT_GT(a[r].k.n_residual(), 20);
    const float* Kr = K.data() + r * S * D;
    int64_t slot = 0;
    for (int64_t e = 0; e < a[r].n_other(); ++e) {
      const Meta m = a[r].meta_at(e);
      if (!m.res_k) continue;
      const int64_t t = e + m.anchors_before;
      codec.decode(&a[r].k.codes[slot * codec.code_bytes()], a[r].k.scales[slot], za.data(), scratch.data());
      codec.decode(&b[r].k.codes[slot * codec.code_bytes()], b[r].k.scales[slot], zb.data(), scratch.data());
      core::rope_rotate_at(zb.data(), D, roped.key_rope, offset + t, /*inverse=*/true);
      double ea = 0, eb = 0, rr = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double res = Kr[t * D + d] - a[r].coef_k(e) * core::half_to_float(a[r].anchor_k[m.anchor_k * D + d]);
        ea += (za[d] - res) * (za[d] - res);
        eb += (zb[d] - res) * (zb[d] - res);
        rr += res * res;
      }
      err_plain += std::sqrt(ea / rr);
      err_roped += std::sqrt(eb / rr);
      ++n, ++slot;
    }
    reconstruct_row(a[r], codec, ka.data(), va.data());
    reconstruct_row(b[r], codec, kb.data(), vb.data());
    EXPECT_EQ(va, vb);
    for (int64_t i = 0; i < S * D; ++i) {
      rec_plain += (ka[i] - Kr[i]) * (ka[i] - Kr[i]);
      rec_roped += (kb[i] - Kr[i]) * (kb[i] - Kr[i]);
    }
  }
  err_plain /= static_cast<double>(n);
  err_roped /= static_cast<double>(n);
  // 2-bit codes leave ~1/3 of a residual (docs/codec.md); a residual in the
  // wrong frame would leave all of it (relative error ~1.4).
  EXPECT_LT(err_plain, 0.45);
  EXPECT_NEAR(err_roped, err_plain, 0.1 * err_plain);
  EXPECT_NEAR(rec_roped, rec_plain, 0.1 * rec_plain);
}

// A segment compressed to extend another (SegmentInput::extends) may take
// the earlier segment's anchors: tokens close to them do, the fast path and
// the reference agree on every choice, and extend_row gives one well-formed
// row that decodes the earlier tokens bit for bit and the new ones as the
// part's own row would with the earlier anchors.
TEST(Compressor, AnExtendingSegmentTakesTheAnchorsBeforeIt) {
  const int64_t B = 1, H = 2, S1 = 300, S2 = 128, D = 64;
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight})
  for (bool key_rope : {false, true}) {
    SCOPED_TRACE(::testing::Message() << to_string(layout) << (key_rope ? " key_rope" : ""));
    AnchorKVConfig cfg;
    cfg.theta = 0.15;
    cfg.anchor_frac = 1.0 / 32;
    cfg.window = 8;
    cfg.metadata = layout;
    if (key_rope) cfg.key_rope = {true, 10000.0, RopeStyle::kNormal, 0, {}};
    const ResidualCodec codec(D, cfg.residual_bits, cfg.scale, cfg.seed);
    const auto K1 = random_kv(B, H, S1, D, 61), V1 = random_kv(B, H, S1, D, 62);
    const std::vector<CompressedRow> prior = compress(SegmentInput{B, H, S1, D, K1.data(), V1.data()}, cfg, codec);
    // The part: every other token a multiple of one of the prior's anchors (fp16 values), the rest new.
    auto K2 = random_kv(B, H, S2, D, 63, 3), V2 = random_kv(B, H, S2, D, 64, 3);
    for (int64_t r = 0; r < B * H; ++r)
      for (int64_t t = 0; t < S2; t += 2) {
        const int64_t j = (t / 2) % prior[r].n_anchor;
        for (int64_t d = 0; d < D; ++d) {
          K2[(r * S2 + t) * D + d] = 0.5f * core::half_to_float(prior[r].anchor_k[j * D + d]);
          V2[(r * S2 + t) * D + d] = 2.0f * core::half_to_float(prior[r].anchor_v[j * D + d]);
        }
      }
    SegmentInput in{B, H, S2, D, K2.data(), V2.data()};
    in.extends = prior.data();
    AnchorKVConfig part_cfg = cfg;
    if (key_rope) part_cfg.key_rope.position_offset += S1;
    const auto ref = analyze_reference(in, part_cfg), fast = analyze(in, part_cfg);
    for (int64_t r = 0; r < B * H; ++r) {
      ASSERT_EQ(ref[r].anchors, fast[r].anchors);
      ASSERT_EQ(ref[r].k.anchor, fast[r].k.anchor);
      ASSERT_EQ(ref[r].v.anchor, fast[r].v.anchor);
    }
    const std::vector<CompressedRow> part = compress(in, part_cfg, codec), part_ref = compress_reference(in, part_cfg, codec);
    for (int64_t r = 0; r < B * H; ++r) {
      const CompressedRow& p = prior[r];
      EXPECT_EQ(part[r].meta16, part_ref[r].meta16);
      EXPECT_EQ(part[r].meta32, part_ref[r].meta32);
      int64_t took_prior_k = 0, took_prior_v = 0;
      for (int64_t e = 0; e < part[r].n_other(); ++e) {
        took_prior_k += part[r].fields_at(e).anchor_k < p.n_anchor;
        took_prior_v += part[r].fields_at(e).anchor_v < p.n_anchor;
      }
      EXPECT_GE(took_prior_k, S2 / 4) << "tokens next to an earlier anchor take it";
      EXPECT_GE(took_prior_v, S2 / 4);
      const CompressedRow joined = extend_row(p, part[r]);
      EXPECT_EQ(check_row(joined, D, codec.code_bytes()), "");
      EXPECT_EQ(joined.length, S1 + S2);
      EXPECT_EQ(joined.n_anchor, p.n_anchor + part[r].n_anchor);
      EXPECT_EQ(joined.buffer_bytes(), p.buffer_bytes() + part[r].buffer_bytes() - (layout == MetadataLayout::kTight ? 2 : 0));
      std::vector<float> jk((S1 + S2) * D), jv(jk.size()), pk(S1 * D), pv(pk.size());
      reconstruct_row(joined, codec, jk.data(), jv.data());
      reconstruct_row(p, codec, pk.data(), pv.data());
      EXPECT_TRUE(std::equal(pk.begin(), pk.end(), jk.begin())) << "the earlier tokens as they were";
      EXPECT_TRUE(std::equal(pv.begin(), pv.end(), jv.begin()));
      double err = 0, norm = 0;  // the new tokens as given, to the codec's error
      for (int64_t t = 0; t < S2; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const double x = K2[(r * S2 + t) * D + d], y = jk[(S1 + t) * D + d];
          err += (x - y) * (x - y);
          norm += x * x;
        }
      EXPECT_LT(err / norm, 0.5);
    }
    AnchorKVConfig tight_mismatch = part_cfg;  // a part made without `extends` does not join
    if (layout == MetadataLayout::kSeed) continue;
    in.extends = nullptr;
    const auto alone = compress(in, tight_mismatch, codec);
    if (alone[0].k.coef_exp != prior[0].k.coef_exp || alone[0].v.coef_exp != prior[0].v.coef_exp) {
      EXPECT_THROW(extend_row(prior[0], alone[0]), Error);
    }
  }
}

// A short segment extending another, whose own anchor would take most of its
// bytes, may take none (AnchorCount::kAuto): its tokens then all name the
// earlier anchors, its bytes go to residuals, and the joined row is whole.
TEST(Compressor, AShortExtendingSegmentMayTakeNoAnchorOfItsOwn) {
  const int64_t B = 1, H = 2, S1 = 256, S2 = 16, D = 128;
  AnchorKVConfig cfg;
  cfg.theta = 0.05;
  cfg.metadata = MetadataLayout::kTight;
  cfg.anchor_count = AnchorCount::kAuto;
  const ResidualCodec codec(D, cfg.residual_bits, cfg.scale, cfg.seed);
  const auto K1 = random_kv(B, H, S1, D, 71), V1 = random_kv(B, H, S1, D, 72);
  const auto prior = compress(SegmentInput{B, H, S1, D, K1.data(), V1.data()}, cfg, codec);
  const auto K2 = random_kv(B, H, S2, D, 73), V2 = random_kv(B, H, S2, D, 74);
  SegmentInput in{B, H, S2, D, K2.data(), V2.data()};
  EXPECT_NE(anchor_fractions(in, cfg).front(), 0.0) << "a segment on its own keeps an anchor";
  in.extends = prior.data();
  ASSERT_EQ(anchor_fractions(in, cfg).front(), 0.0);
  const auto part = compress(in, cfg, codec), part_ref = compress_reference(in, cfg, codec);
  int64_t residuals = 0;
  for (int64_t r = 0; r < B * H; ++r) {
    EXPECT_EQ(part[r].meta16, part_ref[r].meta16);
    EXPECT_EQ(part[r].n_anchor, part_ref[r].n_anchor);
    residuals += part[r].n_residual();
    const CompressedRow joined = extend_row(prior[r], part[r]);
    EXPECT_EQ(check_row(joined, D, codec.code_bytes()), "");
    for (int64_t e = 0; e < part[r].n_other(); ++e) EXPECT_LT(part[r].fields_at(e).anchor_k, joined.n_anchor);
  }
  int64_t own = 0;
  for (const auto& row : part) own += row.n_anchor;
  EXPECT_EQ(own, 0) << "random tokens: the earlier anchors and residuals beat an anchor of their own";
  EXPECT_GT(residuals, 0);
}

TEST(Compressor, MoreAnchorsThanTheLayoutHoldsIsRejected) {
  SegmentInput in{1, 1, (int64_t{1} << 21) + 8, 4, nullptr, nullptr};
  AnchorKVConfig cfg;
  cfg.anchor_frac = 0.9;
  EXPECT_THROW(check_segment(in, cfg), Error);
  cfg.anchor_frac = 1.0;  // every token an anchor: no metadata needed
  EXPECT_NO_THROW(check_segment(in, cfg));
}

}  // namespace
}  // namespace anchorkv::compress
