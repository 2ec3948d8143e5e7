#include "anchorkv/attention.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <tuple>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "cache/store.h"
#include "compress/segment.h"
#include "kernels/attention_kernels.h"
#include "kernels/causal_attention.h"
#include "kernels/entries.h"
#include "anchorkv/cachefile.h"

namespace anchorkv {
namespace {

using testing_util::random_kv;

// Compressed attention vs dense attention over the cache's own f32 reconstruction.
constexpr double kReconstructionNmse = 1e-6;
// SIMD kernels (vector exp, lane-order sums) vs the scalar reference kernels.
constexpr double kSimdVsReferenceNmse = 1e-10;
// With bf16 residual arithmetic (AttentionOptions::bf16_residuals) each
// rotated query coordinate and value weight is rounded by up to 2^-9 of
// itself: a residual's score moves by ~1e-3 of its residual term, and these
// random small-head tests (residuals carrying most of each key) move by up to
// ~1.5e-6 against the reconstruction (fp32: ~2e-7). The fast kernel and its
// twin round the same queries, but each rounds its value weights p * scale
// under its own softmax shift (the fast kernel's lags the maximum by up to
// kHeadroom), so they differ by the weights' rounding; bf16 against fp32
// by both.
// With pre-RoPE keys the fast kernel's anchor scores are bf16 products too
// (AttentionOptions::bf16_scores: each entry's rotated key and the queries
// rounded; the twin scores in fp32): up to ~6e-6 on these heads.
constexpr double kBf16ReconstructionNmse = 1.5e-5;
constexpr double kBf16VsReferenceNmse = 1.5e-5;

// Dense causal attention in double over [n, D] rows; query i at position n - Sq + i.
std::vector<double> dense_reference(const std::vector<float>& q /*[B,Hq,Sq,D]*/, const std::vector<float>& K,
                                    const std::vector<float>& V /*[B,H,n,D]*/, int64_t B, int64_t H,
                                    int64_t Hq, int64_t Sq, int64_t n, int64_t D) {
  std::vector<double> y(static_cast<size_t>(B * Hq * Sq * D), 0.0);
  const int64_t G = Hq / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t h = hq / G, P = n - Sq + i;
        const float* qi = &q[((b * Hq + hq) * Sq + i) * D];
        const float* Kr = &K[(b * H + h) * n * D];
        const float* Vr = &V[(b * H + h) * n * D];
        std::vector<double> s(static_cast<size_t>(P + 1));
        double mx = -1e300;
        for (int64_t t = 0; t <= P; ++t) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * Kr[t * D + d];
          s[t] = dot * scale;
          mx = std::max(mx, s[t]);
        }
        double l = 0;
        for (auto& x : s) l += (x = std::exp(x - mx));
        double* yo = &y[((b * Hq + hq) * Sq + i) * D];
        for (int64_t t = 0; t <= P; ++t)
          for (int64_t d = 0; d < D; ++d) yo[d] += s[t] / l * Vr[t * D + d];
      }
  return y;
}

// The cache's contents in f32: exact parts from fetch(), the segment decoded in f32.
void reconstruct_f32(const AnchorKVCache& c, std::vector<float>& K, std::vector<float>& V) {
  const auto& st = internal::unlocked_state(c);
  const KVPair dense = c.fetch();
  K = dense.keys.to_f32();
  V = dense.values.to_f32();
  if (!st.compressed()) return;
  const int64_t n = st.tokens_per_row(), D = dense.keys.shape()[3];
  for (const auto& seg : st.segments) {
    std::vector<float> k(static_cast<size_t>(seg.tokens * D)), v(k.size());
    for (int64_t r = 0; r < dense.keys.shape()[0] * dense.keys.shape()[1]; ++r) {
      compress::reconstruct_row(seg.rows[r], *st.codec, k.data(), v.data());
      std::copy(k.begin(), k.end(), K.begin() + (r * n + seg.pos0) * D);
      std::copy(v.begin(), v.end(), V.begin() + (r * n + seg.pos0) * D);
    }
  }
}

double nmse(const std::vector<double>& ref, const std::vector<float>& got) {
  double e = 0, s = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (ref[i] - got[i]) * (ref[i] - got[i]);
    s += ref[i] * ref[i];
  }
  return e / std::max(s, 1e-300);
}

void check_against_dense_and_twin(const AnchorKVCache& cache, const std::vector<float>& q, int64_t B, int64_t H,
                                  int64_t Hq, int64_t Sq, int64_t D);

struct Case {
  int64_t S, D, G, B, Sq;
  bool tail;
};

void run_case(const Case& c, MetadataLayout layout = MetadataLayout::kSeed, double anchor_frac = 1.0 / 16,
              int64_t segment_tokens = 0, int64_t recent_tokens = 0, int64_t extend_tokens = 0) {
  SCOPED_TRACE(::testing::Message() << "S=" << c.S << " D=" << c.D << " G=" << c.G << " B=" << c.B
                                    << " Sq=" << c.Sq << " tail=" << c.tail);
  const int64_t H = 2, Hq = H * c.G;
  AnchorKVConfig cfg;
  cfg.theta = 0.15;  // residuals on K and V
  cfg.anchor_frac = anchor_frac;
  cfg.window = 8;
  cfg.metadata = layout;
  cfg.segment_tokens = segment_tokens;
  cfg.recent_tokens = recent_tokens;
  cfg.extend_tokens = extend_tokens;
  AnchorKVCache cache(cfg);
  const auto K = random_kv(c.B, H, c.S, c.D, 11), V = random_kv(c.B, H, c.S, c.D, 12);
  // A streaming cache is fed a segment at a time (a longer call closes up to 16 in one).
  const int64_t step = segment_tokens > 0 ? segment_tokens : c.S;
  for (int64_t at = 0; at < c.S; at += step) {
    const int64_t n = std::min(step, c.S - at);
    const Shape4 strides{H * c.S * c.D, c.S * c.D, c.D, 1};
    cache.update(TensorView{&K[at * c.D], DType::kF32, {c.B, H, n, c.D}, strides},
                 TensorView{&V[at * c.D], DType::kF32, {c.B, H, n, c.D}, strides});
  }
  if (c.tail) {
    const int64_t T = std::max<int64_t>(c.Sq, 3);
    const auto Kt = random_kv(c.B, H, T, c.D, 13), Vt = random_kv(c.B, H, T, c.D, 14);
    cache.update_and_fetch(TensorView::f32(Kt.data(), {c.B, H, T, c.D}),
                           TensorView::f32(Vt.data(), {c.B, H, T, c.D}));
  }
  if (cache.offset() < c.Sq) return;
  if (segment_tokens > 0) {
    ASSERT_GT(internal::unlocked_state(cache).segments.size(), 1u);
  }
  if (extend_tokens > 0) {  // some segment extended another
    int64_t longest = 0;
    for (const auto& seg : internal::unlocked_state(cache).segments) longest = std::max(longest, seg.tokens);
    ASSERT_GT(longest, segment_tokens);
    ASSERT_LE(longest, extend_tokens);
  }
  if (c.S >= 1000) {  // the sweep must exercise key and value residuals
    int64_t rk = 0, rv = 0;
    for (const auto& row : internal::unlocked_state(cache).segments.front().rows) {
      rk += row.k.n_residual();
      rv += row.v.n_residual();
    }
    ASSERT_GT(rk, 0);
    ASSERT_GT(rv, 0);
  }
  check_against_dense_and_twin(cache, random_kv(c.B, Hq, c.Sq, c.D, 15), c.B, H, Hq, c.Sq, c.D);
}

// attend() with `base` options (RoPE, ...) against `ref`, dense attention over
// the cache's reconstruction, then the scalar twin and itself on 1 and 2
// threads (and 8, where rows too few to share out whole take the phased
// plan): in both residual arithmetics (bf16 falls back to fp32 where the CPU
// lacks it, and the two runs are then the same), and bf16 against fp32.
void expect_kernels_agree(const TensorView& qv, const AnchorKVCache& cache, const std::vector<double>& ref,
                          const AttentionOptions& base) {
  std::vector<float> y_fp32;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 residuals" : "fp32 residuals");
    AttentionOptions o1 = base, o2 = base, oref = base;
    o1.threads = 1;
    o2.threads = 2;
    oref.reference = true;
    oref.threads = 2;
    o1.bf16_residuals = o2.bf16_residuals = oref.bf16_residuals = bf16;
    o1.bf16_scores = o2.bf16_scores = oref.bf16_scores = bf16;
    AttentionStats stats;
    const auto y1 = attend(qv, cache, o1, &stats).to_f32();
    const auto y2 = attend(qv, cache, o2).to_f32();
    AttentionOptions o8 = o2;  // rows split whole or in phases (attend.cc): the same bits
    o8.threads = 8;
    const auto y8 = attend(qv, cache, o8).to_f32();
    const auto yr = attend(qv, cache, oref).to_f32();
    EXPECT_EQ(stats.compressed, cache.is_compressed());
    const double tolerance = bf16 ? kBf16ReconstructionNmse : kReconstructionNmse;
    EXPECT_LE(nmse(ref, y1), tolerance);
    EXPECT_LE(nmse(ref, yr), tolerance);
    ASSERT_EQ(y1, y2) << "results must be bit-identical for 1 and 2 threads";
    ASSERT_EQ(y1, y8) << "results must be bit-identical for 1 and 8 threads";
    EXPECT_LE(nmse(std::vector<double>(yr.begin(), yr.end()), y1),
              bf16 ? kBf16VsReferenceNmse : kSimdVsReferenceNmse);
    if (!bf16)
      y_fp32 = y1;
    else
      EXPECT_LE(nmse(std::vector<double>(y_fp32.begin(), y_fp32.end()), y1), kBf16VsReferenceNmse)
          << "bf16 against fp32 residuals";
  }
}

// attend() on the cache: against dense attention over the reconstruction, the
// scalar twin, and itself on 1 and 2 threads.
void check_against_dense_and_twin(const AnchorKVCache& cache, const std::vector<float>& q, int64_t B, int64_t H,
                                  int64_t Hq, int64_t Sq, int64_t D) {
  const TensorView qv = TensorView::f32(q.data(), {B, Hq, Sq, D});
  std::vector<float> Kr, Vr;
  reconstruct_f32(cache, Kr, Vr);
  const auto ref = dense_reference(q, Kr, Vr, B, H, Hq, Sq, cache.offset(), D);

  expect_kernels_agree(qv, cache, ref, AttentionOptions{});
}

TEST(Attention, CompressedMatchesDenseOverReconstructionSweep) {
  const int64_t Ss[] = {1, 31, 32, 33, 1000, 4097};
  const int64_t Ds[] = {64, 80, 128};
  const int64_t Gs[] = {1, 4, 8};
  const int64_t Bs[] = {1, 3};
  const int64_t Sqs[] = {1, 7};
  int i = 0;
  for (int64_t S : Ss)
    for (int64_t D : Ds) {
      // Vary the other dimensions along the sweep so each value meets every S and D.
      for (int rep = 0; rep < 2; ++rep, ++i) {
        const Case c{S, D, Gs[i % 3], Bs[(i / 3) % 2], Sqs[(i / 2) % 2], (i % 4) < 2};
        run_case(c);
      }
    }
}

// The fast kernel's softmax runs over sub-tiles of a tile with a shift set
// by the first: keys in the second half of the row score ~160 above the
// first half's, so a later sub-tile must move the shift (exp(160) would
// overflow) and rescale what was summed before it.
TEST(Attention, ALateSubTileRaisesTheSoftmaxShift) {
  const int64_t B = 1, H = 2, G = 4, Hq = H * G, S = 3000, D = 64;
  AnchorKVConfig cfg;
  cfg.theta = 0.15;
  cfg.window = 8;
  AnchorKVCache cache(cfg);
  auto K = random_kv(B, H, S, D, 21);
  const auto V = random_kv(B, H, S, D, 22);
  auto q = random_kv(B, Hq, 1, D, 23);
  for (int64_t r = 0; r < H; ++r)
    for (int64_t t = S / 2; t < S; ++t)
      for (int64_t d = 0; d < D; ++d) K[(r * S + t) * D + d] += 20.0f;  // q . k grows by 20 * sum(q)
  for (float& x : q) x = 1.0f + 0.1f * x;  // sum(q) ~ 64: +160 after the 1/sqrt(D) scale
  cache.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  ASSERT_TRUE(cache.is_compressed());
  check_against_dense_and_twin(cache, q, B, H, Hq, 1, D);
}

// Rows longer than one chunk of entries (8192): chunks after the first start
// from the residual slots the row's slot index gives.
TEST(Attention, SeveralEntryChunksPerRow) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kTight})
    run_case({20000, 64, 4, 1, 1, true}, layout, 1.0 / 128);
}

// The dispatcher picks the best target of this CPU; force each one it has
// (AVX-512 kernels have their own forms; the others take the generic ones).
TEST(Attention, EverySimdTarget) {
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    run_case({1000, 64, 4, 1, 1, true});
    run_case({1000, 128, 8, 1, 3, false}, MetadataLayout::kTight);
    run_case({1000, 80, 4, 1, 1, false}, MetadataLayout::kCompact);
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

TEST(Attention, EveryGroupBatchQueryAndTailCombinationAtSmallSize) {
  for (int64_t G : {1, 4, 8})
    for (int64_t B : {1, 3})
      for (int64_t Sq : {1, 7})
        for (bool tail : {false, true}) run_case({300, 64, G, B, Sq, tail});
}

TEST(Attention, CompactMetadataLayout) {
  for (const Case& c : {Case{1000, 64, 4, 2, 7, true}, Case{1000, 80, 1, 1, 1, false},
                        Case{4097, 128, 8, 1, 7, false}, Case{300, 64, 4, 3, 1, true}})
    run_case(c, MetadataLayout::kCompact);
}

TEST(Attention, TightMetadataLayout) {
  for (const Case& c : {Case{1000, 64, 4, 2, 7, true}, Case{1000, 80, 1, 1, 1, false},
                        Case{4097, 128, 8, 1, 7, false}, Case{300, 64, 4, 3, 1, true}})
    run_case(c, MetadataLayout::kTight);
}

TEST(Attention, FullCacheMatchesDenseReference) {
  const int64_t B = 2, H = 2, Hq = 8, S = 777, D = 80, Sq = 5;
  FullKVCache cache;
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  cache.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  const auto q = random_kv(B, Hq, Sq, D, 3);
  const auto ref = dense_reference(q, K, V, B, H, Hq, Sq, S, D);  // K, V are fp16-exact
  AttentionOptions o;
  const auto y = attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), cache, o).to_f32();
  EXPECT_LE(nmse(ref, y), 1e-9);
  o.reference = true;
  EXPECT_LE(nmse(ref, attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), cache, o).to_f32()), 1e-9);
  o.reference = false;
  o.out_dtype = DType::kF16;
  const Tensor y16 = attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), cache, o);
  EXPECT_EQ(y16.dtype(), DType::kF16);
  EXPECT_LE(nmse(ref, y16.to_f32()), 1e-6);
}

TEST(Attention, BlockedCausalPrefillMatchesDenseReferenceAndAttend) {
  // T not a multiple of the 64-query block; GQA 4; fp16-exact K/V (the kernel rounds them as a cache does).
  const int64_t H = 2, Hq = 8, T = 150, D = 64;
  const auto K = random_kv(1, H, T, D, 4), V = random_kv(1, H, T, D, 5), q = random_kv(1, Hq, T, D, 6);
  std::vector<float> y1(q.size()), y2(q.size());
  kernels::causal_attention(q.data(), K.data(), V.data(), Hq, H, T, D, 1.0f / std::sqrt(float(D)), y1.data(),
                            1);
  kernels::causal_attention(q.data(), K.data(), V.data(), Hq, H, T, D, 1.0f / std::sqrt(float(D)), y2.data(),
                            2);
  EXPECT_EQ(y1, y2) << "thread count changed the bits";
  EXPECT_LE(nmse(dense_reference(q, K, V, 1, H, Hq, T, T, D), y1), 1e-10);
  FullKVCache cache;  // attend() over the cache the chunk fills: the runtime's reference path
  cache.update(TensorView::f32(K.data(), {1, H, T, D}), TensorView::f32(V.data(), {1, H, T, D}));
  AttentionOptions o;
  o.reference = true;
  const auto ref = attend(TensorView::f32(q.data(), {1, Hq, T, D}), cache, o).to_f32();
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(double(ref[i]) - y1[i]));
  EXPECT_LE(worst, 1e-5);
  // Query 0 sees key 0 only: its output is value 0 exactly.
  for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(y1[d], V[d]);
}

// Sliding-window layers: keys before the chunk (the ring) and a window. The
// blocked kernel equals its scalar twin and is the same for 1 and 2 threads;
// a window as long as every key changes nothing; query i of the chunk sees
// exactly the `window` keys ending at its own.
TEST(Attention, WindowedCausalPrefillMatchesItsScalarTwin) {
  const int64_t H = 2, Hq = 4, D = 32;
  for (auto [T, before, window] : {std::tuple{150, 0, 40}, std::tuple{70, 37, 64}, std::tuple{200, 90, 1},
                                   std::tuple{64, 10, 1000}}) {
    const int64_t N = before + T;
    const auto K = random_kv(1, H, N, D, 7), V = random_kv(1, H, N, D, 8), q = random_kv(1, Hq, T, D, 9);
    const float scale = 1.0f / std::sqrt(float(D));
    std::vector<float> y1(q.size()), y2(q.size()), ref(q.size()), open(q.size()), open_ref(q.size());
    kernels::causal_attention(q.data(), K.data(), V.data(), Hq, H, T, N, D, scale, window, y1.data(), 1);
    kernels::causal_attention(q.data(), K.data(), V.data(), Hq, H, T, N, D, scale, window, y2.data(), 2);
    kernels::causal_attention_ref(q.data(), K.data(), V.data(), Hq, H, T, N, D, scale, window, ref.data());
    auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    EXPECT_EQ(y1, y2) << "thread count changed the bits";
    EXPECT_LE(nmse(wide(ref), y1), 1e-10) << T << " " << before << " " << window;
    kernels::causal_attention(q.data(), K.data(), V.data(), Hq, H, T, N, D, scale, 0, open.data(), 1);
    kernels::causal_attention_ref(q.data(), K.data(), V.data(), Hq, H, T, N, D, scale, N, open_ref.data());
    EXPECT_LE(nmse(wide(open_ref), open), 1e-10);
    if (window >= N) {
      EXPECT_LE(nmse(wide(open), y1), 1e-12);
    }
    if (window == 1) {  // each query sees its own key only: its value, exactly
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < D; ++d) ASSERT_FLOAT_EQ(y1[i * D + d], V[(before + i) * D + d]);
    }
  }
}

// The sliding-window cache keeps the last `window` positions in order (a
// ring past the window), its bytes are those it keeps, decode attention reads
// them, and a cache file round-trips it.
TEST(Attention, SlidingWindowCacheKeepsTheLastWindowPositions) {
  const int64_t H = 2, D = 16, W = 50;
  SlidingWindowKVCache ring(W);
  FullKVCache full;
  int64_t call = 0;
  for (int64_t S : {30, 1, 1, 40, 1, 70, 1}) {
    const auto K = random_kv(1, H, S, D, 100 + call), V = random_kv(1, H, S, D, 200 + call);
    for (KVCache* c : std::vector<KVCache*>{&ring, &full})
      c->update(TensorView::f32(K.data(), {1, H, S, D}), TensorView::f32(V.data(), {1, H, S, D}));
    ++call;
  }
  const int64_t seen = full.offset(), kept = std::min(seen, W);
  EXPECT_EQ(ring.offset(), seen);
  EXPECT_EQ(ring.tokens_kept(), H * kept);
  EXPECT_EQ(ring.nbytes(), H * kept * D * 4);
  const KVPair r = ring.fetch(), f = full.fetch();
  ASSERT_EQ(r.keys.shape()[2], kept);
  const auto rk = r.keys.to_f32(), fk = f.keys.to_f32(), rv = r.values.to_f32(), fv = f.values.to_f32();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < kept; ++t)
      for (int64_t d = 0; d < D; ++d) {
        ASSERT_EQ(rk[(h * kept + t) * D + d], fk[(h * seen + seen - kept + t) * D + d]);
        ASSERT_EQ(rv[(h * kept + t) * D + d], fv[(h * seen + seen - kept + t) * D + d]);
      }
  const auto q = random_kv(1, 4, 1, D, 300);
  const auto y = attend(TensorView::f32(q.data(), {1, 4, 1, D}), ring).to_f32();
  const auto ref = dense_reference(q, rk, rv, 1, H, 4, 1, kept, D);
  EXPECT_LE(nmse(ref, y), 1e-9);
  const auto bytes = serialize_caches({&ring});
  LoadedCaches back = load_caches_from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(back.caches[0]->fetch().keys.to_f32(), rk);
  EXPECT_EQ(serialize_caches({back.caches[0].get()}), bytes);
  EXPECT_THROW(SlidingWindowKVCache(0), Error);
}

// A cache whose store only knows how to fetch: attention reads its dense
// fetch (the default attention source).
class FetchOnlyStore final : public internal::CacheStore {
 public:
  std::string name() const override { return "wrapped"; }
  const char* api_name() const override { return "WrappedCache"; }
  void store(const cache::StagedInput& in, const internal::CacheShape&) override { rows.append(in); }
  KVPair fetch(const internal::CacheShape& s) const override { return rows.to_pair(s.B, s.H, s.D); }
  int64_t nbytes(const internal::CacheShape&) const override { return rows.buffer_bytes(); }
  cache::ExactRows rows;
};
class WrappedCache final : public KVCache {
 public:
  WrappedCache() : KVCache(std::make_unique<FetchOnlyStore>()) {}
};

TEST(Attention, GenericCacheAndNonContiguousQueries) {
  const int64_t B = 1, H = 2, Hq = 4, S = 300, D = 64, Sq = 3;
  WrappedCache w;
  FullKVCache f;
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  w.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  f.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  const auto q = random_kv(B, Hq, Sq, D, 3);
  const auto a = attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), w).to_f32();
  const auto b = attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), f).to_f32();
  EXPECT_EQ(a, b);
  // Queries laid out [B, Sq, Hq, D], viewed as [B, Hq, Sq, D].
  std::vector<float> qt(q.size());
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t s = 0; s < Sq; ++s)
      for (int64_t d = 0; d < D; ++d) qt[(s * Hq + h) * D + d] = q[(h * Sq + s) * D + d];
  TensorView qv{qt.data(), DType::kF32, {B, Hq, Sq, D}, {Hq * Sq * D, D, Hq * D, 1}};
  EXPECT_EQ(attend(qv, f).to_f32(), b);
}

// Chunks longer than a tile: with 8 rows a row's entries are cut into 4
// chunks (attend.cc, entry_chunk_size), here of ~8400 entries, each folded
// from two tiles, the first tile's lookahead running on into the second; 1
// and 2 threads give the same bits.
TEST(Attention, LongRowsFoldTilesWithinAChunk) {
  const int64_t B = 4, H = 2, G = 4, S = 36000, D = 64;
  AnchorKVConfig cfg;
  cfg.theta = 0.15;
  cfg.anchor_frac = 1.0 / 16;
  AnchorKVCache cache(cfg);
  const auto K = random_kv(B, H, S, D, 21), V = random_kv(B, H, S, D, 22);
  cache.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  for (const auto& row : internal::unlocked_state(cache).segments.front().rows) ASSERT_GT(row.n_other(), 4 * 8192);
  AttentionStats stats;
  const auto q = random_kv(B, H * G, 1, D, 23);
  attend(TensorView::f32(q.data(), {B, H * G, 1, D}), cache, {}, &stats);
  EXPECT_EQ(stats.chunks_per_row, 5);  // the anchors and four chunks of entries
  check_against_dense_and_twin(cache, q, B, H, H * G, 1, D);
}

TEST(Attention, WorkspaceStaysFarBelowTheDenseCache) {
  const int64_t B = 1, H = 2, S = 32768, D = 128, Hq = 8;
  AnchorKVCache cache;
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  cache.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  const auto q = random_kv(B, Hq, 1, D, 3);
  AttentionStats stats;
  AttentionOptions o;
  o.threads = 2;
  attend(TensorView::f32(q.data(), {B, Hq, 1, D}), cache, o, &stats);
  ASSERT_TRUE(stats.compressed);
  const int64_t dense_f32 = B * H * S * D * 4 * 2;  // what reconstructing K and V would take
  const int64_t k = S / 128, nq = Hq / H, R = B * H;
  // O(anchors * D + Sq * D + threads * tile), with the constants of this implementation.
  const int64_t entry_tile = 8192 * (std::max<int64_t>(nq, 4) + 12);  // scores + decoded metadata
  const int64_t bound =
      4 * (R * (2 * k * D + 2 * nq * k + nq * D) +            // per-row prep
           R * stats.chunks_per_row * nq * (2 + 2 * D + k) +  // chunk partials
           R * nq * D +
           2 * (std::max<int64_t>(512 * (nq + 3), entry_tile) + 6 * D + nq * (2 + 2 * D + k) + 9 * k)) +
      64 * R;
  EXPECT_LE(stats.workspace_bytes, bound * 5 / 4);
  EXPECT_LT(stats.workspace_bytes, dense_f32 / 20) << stats.workspace_bytes << " bytes";
  EXPECT_LE(stats.chunks_per_row, 2 * 16 + 1 + 16);
}

TEST(Attention, BadInput) {
  AnchorKVCache empty;
  std::vector<float> q(64, 1.0f);
  EXPECT_THROW(attend(TensorView::f32(q.data(), {1, 1, 1, 64}), empty), Error);
  AnchorKVCache c;
  const auto K = random_kv(1, 2, 40, 16, 1);
  c.update_and_fetch(TensorView::f32(K.data(), {1, 2, 40, 16}), TensorView::f32(K.data(), {1, 2, 40, 16}));
  const auto before = c.anchorkv_bytes();
  std::vector<float> q3(3 * 16, 1.0f);
  auto expect = [&](const TensorView& v, ErrorCode code, const char* needle) {
    try {
      attend(v, c);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[anchorkv::attend]"), std::string::npos);
    }
  };
  expect(TensorView::f32(q3.data(), {1, 3, 1, 16}), ErrorCode::kShapeMismatch, "multiple");
  expect(TensorView::f32(q3.data(), {1, 2, 1, 8}), ErrorCode::kShapeMismatch, "D=16");
  std::vector<float> big(2 * 41 * 16, 0.0f);
  expect(TensorView::f32(big.data(), {1, 2, 41, 16}), ErrorCode::kShapeMismatch, "holds only 40");
  q3[5] = NAN;
  expect(TensorView::f32(q3.data(), {1, 2, 1, 16}), ErrorCode::kNonFinite, "non-finite");
  EXPECT_EQ(c.anchorkv_bytes(), before);
}

}  // namespace
}  // namespace anchorkv

namespace anchorkv {
namespace {

// Rotate rows in double: x[t] at position pos0 + t.
void rope_rows(std::vector<float>& X, int64_t rows, int64_t n, int64_t D, int64_t pos0,
               const RopeOptions& r) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t t = 0; t < n; ++t) {
      float* x = &X[(row * n + t) * D];
      for (int64_t i = 0; i < D / 2; ++i) {
        const int64_t a = r.style == RopeStyle::kNormal ? 2 * i : i;
        const int64_t b = r.style == RopeStyle::kNormal ? 2 * i + 1 : i + D / 2;
        const double th = static_cast<double>(pos0 + t) * std::pow(r.base, -2.0 * i / static_cast<double>(D));
        const double xa = x[a], xb = x[b];
        x[a] = static_cast<float>(xa * std::cos(th) - xb * std::sin(th));
        x[b] = static_cast<float>(xa * std::sin(th) + xb * std::cos(th));
      }
    }
}

RopeOptions check_rope_attention(const AnchorKVCache& cache, const std::vector<float>& q, RopeStyle style,
                                 int64_t offset, int64_t H, int64_t Hq, int64_t Sq, int64_t D);

// key_rope: the cache codes key residuals after RoPE (AnchorKVConfig::key_rope).
void run_rope_case(RopeStyle style, int64_t offset, int64_t S, int64_t Sq, bool head, bool tail,
                   bool key_rope = false, int64_t D = 64, int64_t G = 4,
                   MetadataLayout layout = MetadataLayout::kSeed, int64_t segment_tokens = 0,
                   int64_t recent_tokens = 0, int64_t extend_tokens = 0) {
  SCOPED_TRACE(::testing::Message() << "style=" << static_cast<int>(style) << " offset=" << offset << " S=" << S
                                    << " Sq=" << Sq << " head=" << head << " tail=" << tail
                                    << " key_rope=" << key_rope << " D=" << D << " G=" << G
                                    << " layout=" << to_string(layout));
  const int64_t B = 1, H = 2, Hq = H * G;
  AnchorKVConfig cfg;
  cfg.theta = 0.15;
  cfg.anchor_frac = 1.0 / 16;
  cfg.window = 8;
  cfg.metadata = layout;
  cfg.segment_tokens = segment_tokens;
  cfg.recent_tokens = recent_tokens;
  cfg.extend_tokens = extend_tokens;
  if (key_rope) cfg.key_rope = {true, 10000.0, style, offset, {}};
  AnchorKVCache cache(cfg);
  FullKVCache full;
  auto feed = [&](int64_t n, uint64_t seed) {
    const auto K = random_kv(B, H, n, D, seed), V = random_kv(B, H, n, D, seed + 1);
    cache.update_and_fetch(TensorView::f32(K.data(), {B, H, n, D}), TensorView::f32(V.data(), {B, H, n, D}));
    full.update_and_fetch(TensorView::f32(K.data(), {B, H, n, D}), TensorView::f32(V.data(), {B, H, n, D}));
  };
  if (head) feed(1, 40);
  for (int64_t at = 0, step = segment_tokens > 0 ? segment_tokens : S; at < S; at += step)
    feed(std::min(step, S - at), 42 + at);  // a streaming cache a segment at a time
  if (tail) feed(std::max<int64_t>(Sq, 2), 44);
  if (segment_tokens > 0) {
    ASSERT_GT(internal::unlocked_state(cache).segments.size(), 1u);
  }
  if (extend_tokens > 0) {  // some segment extended another
    int64_t longest = 0;
    for (const auto& seg : internal::unlocked_state(cache).segments) longest = std::max(longest, seg.tokens);
    ASSERT_GT(longest, segment_tokens);
    ASSERT_LE(longest, extend_tokens);
  }
  const auto q = random_kv(B, Hq, Sq, D, 46);
  const RopeOptions rope = check_rope_attention(cache, q, style, offset, H, Hq, Sq, D);
  // The dense kernel with RoPE against the same reference over the exact keys.
  const int64_t n = cache.offset();
  std::vector<float> qr = q;  // each query head's Sq rows at the last Sq positions
  rope_rows(qr, Hq, Sq, D, offset + n - Sq, rope);
  AttentionOptions o1;
  o1.rope = rope;
  o1.threads = 1;
  std::vector<float> Kf = full.fetch().keys.to_f32(), Vf = full.fetch().values.to_f32();
  rope_rows(Kf, B * H, n, D, offset, rope);
  const auto ref_full = dense_reference(qr, Kf, Vf, B, H, Hq, Sq, n, D);
  EXPECT_LE(nmse(ref_full, attend(TensorView::f32(q.data(), {B, Hq, Sq, D}), full, o1).to_f32()), 1e-9);
}

// attend() with pre-RoPE keys (B = 1) against dense attention over the
// reconstruction with RoPE applied explicitly, the scalar twin, and itself on
// 1 and 2 threads. Returns the RoPE it attended with.
RopeOptions check_rope_attention(const AnchorKVCache& cache, const std::vector<float>& q, RopeStyle style,
                                 int64_t offset, int64_t H, int64_t Hq, int64_t Sq, int64_t D) {
  const int64_t B = 1, n = cache.offset();
  RopeOptions rope;
  rope.enabled = true;
  rope.style = style;
  rope.base = 10000.0;
  rope.position_offset = offset;
  // Reference: RoPE applied explicitly to the reconstruction and the queries.
  std::vector<float> Kr, Vr;
  reconstruct_f32(cache, Kr, Vr);
  rope_rows(Kr, B * H, n, D, offset, rope);
  std::vector<float> qr = q;  // each query head's Sq rows at the last Sq positions
  rope_rows(qr, Hq, Sq, D, offset + n - Sq, rope);
  const auto ref = dense_reference(qr, Kr, Vr, B, H, Hq, Sq, n, D);
  AttentionOptions base;
  base.rope = rope;
  expect_kernels_agree(TensorView::f32(q.data(), {B, Hq, Sq, D}), cache, ref, base);
  return rope;
}

TEST(Attention, PreRopeKeysNormalAndNeoxPairing) {
  for (bool key_rope : {false, true}) {
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
      for (int64_t offset : {0, 1000}) {
        run_rope_case(style, offset, 700, 1, false, true, key_rope);
        run_rope_case(style, offset, 700, 7, false, false, key_rope);  // queries inside the compressed segment
      }
    run_rope_case(RopeStyle::kNormal, 0, 3000, 3, true, true, key_rope);  // the segment after a 1-token head
    // rows in several entry chunks (kMinRopeEntryChunk), queries inside the segment
    run_rope_case(RopeStyle::kNeox, 0, 4500, 5, false, false, key_rope);
    // Head dims with their own fast-kernel instances (128), a run-time one (96)
    // and none (80: the general kernel); partial quads (G = 3, 6).
    for (int64_t D : {128, 96, 80})
      for (int64_t G : {3, 4, 6}) run_rope_case(RopeStyle::kNeox, 0, 900, 1, false, true, key_rope, D, G);
    for (MetadataLayout layout : {MetadataLayout::kCompact, MetadataLayout::kTight})
      run_rope_case(RopeStyle::kNormal, 0, 2000, 1, false, true, key_rope, 128, 4, layout);
  }
}

// A key residual is fused into its entry's anchor score as gamma (a + r /
// gamma); entries with gamma = 0 keep theirs apart. Keys in two orthogonal
// halves of the head dim: the few in the upper half are orthogonal to every
// anchor of the lower one (gamma = 0, the whole key a residual). Their key
// utility is 0 (the proxy queries are anchors), so a budget that buys every
// entry a residual gives them one.
TEST(Attention, PreRopeKeyResidualsOfEntriesWithGammaZero) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
    SCOPED_TRACE(to_string(layout));
    const int64_t H = 2, G = 4, S = 700, D = 64;
    AnchorKVConfig cfg;
    cfg.theta = 0.9;
    cfg.anchor_frac = 1.0 / 16;
    cfg.window = 8;
    cfg.metadata = layout;
    AnchorKVCache cache(cfg);
    auto K = random_kv(1, H, S, D, 52);
    const auto V = random_kv(1, H, S, D, 53);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < S; ++t) {
        float* k = &K[(h * S + t) * D];
        const bool upper = t % 97 == 5;
        for (int64_t d = 0; d < D; ++d)
          if ((d >= D / 2) != upper)
            k[d] = 0.0f;
          else if (upper)
            k[d] *= 3.0f;
      }
    cache.update_and_fetch(TensorView::f32(K.data(), {1, H, S, D}), TensorView::f32(V.data(), {1, H, S, D}));
    const auto Kt = random_kv(1, H, 2, D, 54), Vt = random_kv(1, H, 2, D, 55);
    cache.update_and_fetch(TensorView::f32(Kt.data(), {1, H, 2, D}),
                           TensorView::f32(Vt.data(), {1, H, 2, D}));
    int64_t zero_gamma_residuals = 0;
    for (const auto& row : internal::unlocked_state(cache).segments.front().rows) {
      compress::EntryMetaReader meta(row, 0, false);
      for (int64_t e = 0; e < row.n_other(); ++e)
        zero_gamma_residuals += meta.next().res_k && row.coef_k(e) == 0.0f;
    }
    ASSERT_GT(zero_gamma_residuals, 0);
    check_rope_attention(cache, random_kv(1, H * G, 1, D, 56), RopeStyle::kNormal, 0, H, H * G, 1, D);
  }
}

// The generic forms of the pre-RoPE quad kernel (queries per block of
// positions, split residual keys decoded one row at a time) on every target.
TEST(Attention, PreRopeKeysOnEverySimdTarget) {
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    run_rope_case(RopeStyle::kNormal, 1000, 700, 1, false, true);
    run_rope_case(RopeStyle::kNeox, 0, 900, 1, false, true, false, 128, 4);
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

// Residual keys coded before RoPE, decoded into split rows: the register
// form (2-bit, Hadamard, D = 64 / 128) gives the bits of decode_levels,
// rotation().inverse() and rope_split, for both pairings.
TEST(Attention, SplitKeyResidualsMatchTheirScalarTwin) {
  for (int64_t D : {64, 128}) {
    AnchorKVConfig cfg;
    cfg.theta = 0.3;
    AnchorKVCache cache(cfg);
    const auto K = random_kv(1, 1, 600, D, 31), V = random_kv(1, 1, 600, D, 32);
    cache.update_and_fetch(TensorView::f32(K.data(), {1, 1, 600, D}),
                           TensorView::f32(V.data(), {1, 1, 600, D}));
    const auto& st = internal::unlocked_state(cache);
    ASSERT_TRUE(st.compressed());
    const compress::CompressedSide& side = st.segments.front().rows[0].k;
    const int64_t nr = side.n_residual();
    ASSERT_GT(nr, 16);
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
      core::UninitVector<float> fast, twin;
      kernels::EntryScratch sc;
      kernels::split_key_residuals(side, *st.codec, style, 3, nr - 3, true, fast, sc);
      kernels::split_key_residuals(side, *st.codec, style, 3, nr - 3, false, twin, sc);
      EXPECT_EQ(fast, twin) << "D=" << D << " style=" << static_cast<int>(style);
      // scaled per row (the fused pre-RoPE keys): the same bits both ways, and
      // row j the unscaled one times its scale to float rounding
      std::vector<float> scale(static_cast<size_t>(nr - 3));
      core::UninitVector<float> fast_s, twin_s;
      for (size_t j = 0; j < scale.size(); ++j) scale[j] = 0.25f + 0.37f * static_cast<float>(j % 7);
      kernels::split_key_residuals(side, *st.codec, style, 3, nr - 3, true, fast_s, sc, scale.data());
      kernels::split_key_residuals(side, *st.codec, style, 3, nr - 3, false, twin_s, sc, scale.data());
      EXPECT_EQ(fast_s, twin_s) << "D=" << D << " style=" << static_cast<int>(style);
      for (int64_t j = 0; j < nr - 3; ++j)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_NEAR(fast_s[j * D + d], scale[j] * fast[j * D + d],
                      1e-5f * (1.0f + std::fabs(fast[j * D + d])));
      std::vector<float> row(static_cast<size_t>(D)), split(row.size());  // one row by hand
      st.codec->decode(&side.codes[static_cast<size_t>(5 * st.codec->code_bytes())],
                       core::float_to_half(1.0f), row.data(),
                       std::vector<uint8_t>(static_cast<size_t>(D)).data());
      core::rope_split(row.data(), D, style, split.data());
      for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(split[d], twin[2 * D + d]) << d;
    }
  }
}

// A cache whose key residuals were coded for one RoPE is refused any other.
TEST(Attention, KeyRopeCacheRefusesOtherRope) {
  const int64_t B = 1, H = 2, Hq = 8, D = 64, S = 300;
  AnchorKVConfig cfg;
  cfg.theta = 0.2;
  cfg.key_rope = {true, 10000.0, RopeStyle::kNormal, 5, {}};
  AnchorKVCache cache(cfg);
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  cache.update_and_fetch(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  ASSERT_GT(cache.n_residual_total(), 0);
  const auto q = random_kv(B, Hq, 1, D, 3);
  const TensorView qv = TensorView::f32(q.data(), {B, Hq, 1, D});
  AttentionOptions ok;
  ok.rope = cfg.key_rope;
  EXPECT_NO_THROW(attend(qv, cache, ok));
  auto refused = [&](AttentionOptions o, const char* what) {
    try {
      attend(qv, cache, o);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find("key_rope"), std::string::npos) << e.what();
    }
  };
  AttentionOptions o = ok;
  o.rope.enabled = false;
  refused(o, "no RoPE");
  o = ok;
  o.rope.base = 500000.0;
  refused(o, "another base");
  o = ok;
  o.rope.style = RopeStyle::kNeox;
  refused(o, "another pairing");
  o = ok;
  o.rope.position_offset = 0;
  refused(o, "another first position");
}

// A streaming cache: many segments back to back, then the exact tail (or
// none), against dense attention over the reconstruction, the scalar twin
// and 1 vs 2 threads; queries inside the last segment when no tail is left.
TEST(Attention, ManySegments) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
    SCOPED_TRACE(to_string(layout));
    run_case({1000, 64, 4, 1, 1, true}, layout, 1.0 / 16, 128, 16);   // 7 segments, 104 exact
    run_case({1000, 128, 8, 3, 7, false}, layout, 1.0 / 16, 100, 0);  // 10 segments, no tail
    run_case({4097, 80, 3, 1, 7, true}, layout, 1.0 / 64, 1024, 32);  // rows over several entry chunks
    run_case({300, 64, 1, 1, 1, true}, layout, 1.0 / 16, 1, 0);       // one token per segment
  }
}

// Small segments are attended in runs under one softmax per query; a later
// segment whose scores pass the running shift by far more than the kernel's
// headroom rescales what the run has summed so far (values included), and
// an earlier segment holding the maximum shifts the ones after it.
TEST(Attention, SegmentRunsRescaleAcrossSegments) {
  const int64_t B = 1, H = 2, G = 4, Hq = H * G, D = 64, T = 128, Sq = 1;
  const float key_scales[] = {1, 40, 1, 60, 2, 1, 3};
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kTight}) {
    SCOPED_TRACE(to_string(layout));
    AnchorKVConfig cfg;
    cfg.theta = 0.15;
    cfg.anchor_frac = 1.0 / 16;
    cfg.metadata = layout;
    cfg.segment_tokens = T;
    AnchorKVCache cache(cfg);
    uint64_t seed = 70;
    for (float f : key_scales) {
      auto K = random_kv(B, H, T, D, seed++);
      const auto V = random_kv(B, H, T, D, seed++);
      for (float& x : K) x *= f;
      cache.update(TensorView::f32(K.data(), {B, H, T, D}), TensorView::f32(V.data(), {B, H, T, D}));
    }
    const auto Kt = random_kv(B, H, 3, D, seed++), Vt = random_kv(B, H, 3, D, seed++);
    cache.update(TensorView::f32(Kt.data(), {B, H, 3, D}), TensorView::f32(Vt.data(), {B, H, 3, D}));
    ASSERT_GE(internal::unlocked_state(cache).segments.size(), 6u);
    check_against_dense_and_twin(cache, random_kv(B, Hq, Sq, D, seed), B, H, Hq, Sq, D);
  }
}

TEST(Attention, ManySegmentsPreRope) {
  for (bool key_rope : {false, true})
    for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kTight}) {
      run_rope_case(RopeStyle::kNormal, 0, 1000, 1, false, true, key_rope, 64, 4, layout, 128, 16);
      run_rope_case(RopeStyle::kNeox, 1000, 1000, 7, false, false, key_rope, 128, 4, layout, 100, 0);
      run_rope_case(RopeStyle::kNeox, 0, 4500, 5, false, false, key_rope, 64, 3, layout, 1500, 0);
    }
}

// Segments that extend the one before them (AnchorKVConfig::extend_tokens:
// entries naming the earlier part's anchors, positions and residual slots
// after its own) attend like any: against dense attention over the
// reconstruction, the scalar twins and 1 vs 2 threads, with queries after
// them and inside the last (masked), keys after and before RoPE.
TEST(Attention, ExtendedSegments) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
    SCOPED_TRACE(to_string(layout));
    run_case({1000, 64, 4, 1, 1, true}, layout, 1.0 / 16, 64, 16, 320);   // segments of up to 320
    run_case({1000, 128, 8, 2, 7, false}, layout, 1.0 / 16, 100, 0, 300);  // the queries inside the last
  }
  for (bool key_rope : {false, true})
    for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kTight}) {
      run_rope_case(RopeStyle::kNormal, 0, 1000, 1, false, true, key_rope, 64, 4, layout, 64, 16, 256);
      run_rope_case(RopeStyle::kNeox, 1000, 1000, 7, false, false, key_rope, 128, 4, layout, 100, 0, 400);
    }
}

TEST(Attention, MaskedQueriesAfterAnExactHead) {
  // A first S = 1 call stays exact (head), then the prefill is compressed;
  // queries inside the segment must mask by absolute position.
  for (int64_t Sq : {1, 7}) run_rope_case(RopeStyle::kNormal, 0, 500, Sq, true, false);
  const int64_t B = 1, H = 2, Hq = 4, D = 32;
  AnchorKVConfig cfg;
  cfg.anchor_frac = 1.0 / 8;
  cfg.window = 4;
  cfg.theta = 0.2;
  AnchorKVCache cache(cfg);
  const auto K1 = random_kv(B, H, 1, D, 1), K2 = random_kv(B, H, 400, D, 2), V2 = random_kv(B, H, 400, D, 3);
  cache.update_and_fetch(TensorView::f32(K1.data(), {B, H, 1, D}), TensorView::f32(K1.data(), {B, H, 1, D}));
  cache.update_and_fetch(TensorView::f32(K2.data(), {B, H, 400, D}),
                         TensorView::f32(V2.data(), {B, H, 400, D}));
  const auto q = random_kv(B, Hq, 9, D, 4);
  std::vector<float> Kr, Vr;
  reconstruct_f32(cache, Kr, Vr);
  const auto ref = dense_reference(q, Kr, Vr, B, H, Hq, 9, 401, D);
  EXPECT_LE(nmse(ref, attend(TensorView::f32(q.data(), {B, Hq, 9, D}), cache).to_f32()), kReconstructionNmse);
}

}  // namespace
}  // namespace anchorkv

namespace anchorkv {
namespace {

// A compressed cache followed by a chunk held exactly, attended as one
// sequence, equals the same cache with the chunk appended (its exact tail).
TEST(Attention, SeveralCachesAttendAsOneSequence) {
  const int64_t B = 1, H = 2, Hq = 8, S = 700, T = 5, D = 64;
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  const auto Kc = random_kv(B, H, T, D, 3), Vc = random_kv(B, H, T, D, 4);
  const auto q = random_kv(B, Hq, T, D, 5);
  for (bool rope : {false, true}) {
    AnchorKVCache prefix, whole;
    FullKVCache chunk;
    prefix.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
    whole.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
    chunk.update(TensorView::f32(Kc.data(), {B, H, T, D}), TensorView::f32(Vc.data(), {B, H, T, D}));
    whole.update(TensorView::f32(Kc.data(), {B, H, T, D}), TensorView::f32(Vc.data(), {B, H, T, D}));
    AttentionOptions o;
    o.rope.enabled = rope;
    const TensorView qv = TensorView::f32(q.data(), {B, Hq, T, D});
    EXPECT_EQ(attend(qv, {&prefix, &chunk}, o).to_f32(), attend(qv, whole, o).to_f32()) << "rope " << rope;
    FullKVCache empty;
    EXPECT_EQ(attend(qv, {&empty, &whole}, o).to_f32(), attend(qv, whole, o).to_f32())
        << "empty caches are skipped";
    EXPECT_THROW(attend(qv, {&chunk, &prefix}, o), Error) << "a compressed segment must come first";
  }
  FullKVCache other_d;
  const auto K32 = random_kv(B, H, 4, 32, 6);
  other_d.update(TensorView::f32(K32.data(), {B, H, 4, 32}), TensorView::f32(K32.data(), {B, H, 4, 32}));
  AnchorKVCache prefix;
  prefix.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  try {
    attend(TensorView::f32(q.data(), {B, Hq, 1, D}), {&prefix, &other_d});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
  }
}

}  // namespace
}  // namespace anchorkv
