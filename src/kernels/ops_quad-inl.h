// Attention ops: query quads (four queries of one KV row, token-major): anchor
// scores, maxima, the softmax exp and the scatter of value weights.
// A per-target "-inl.h" header of kernels/quad_entries.cc (the only file
// that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_QUAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_QUAD_INL_H_
#undef ANCHORKV_KERNELS_OPS_QUAD_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_QUAD_INL_H_
#endif

#include "hwy/highway.h"
#include "kernels/ops_reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// ---- Query quads: four queries of one KV row, stored token-major (s4[i * 4 + g]),
// so one 4-lane vector carries an entry's scores for the whole quad.


// s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g]: the anchor approximation's scores
// from the quad's interleaved anchor-dot table T [k, 4].
void QuadAnchorScores(const float* HWY_RESTRICT T, const int32_t* HWY_RESTRICT ak,
                      const float* HWY_RESTRICT gk, int64_t n, float* HWY_RESTRICT s4) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g];
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    hn::StoreU(hn::Mul(hn::Set(d4, gk[i]), hn::LoadU(d4, T + ak[i] * 4)), d4, s4 + i * 4);
}


// Per query g: m4[g] = max_i s4[i * 4 + g].
void QuadMax(const float* HWY_RESTRICT s4, int64_t n, float* HWY_RESTRICT m4) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), total = 4 * n;
  for (int g = 0; g < 4; ++g) m4[g] = -HUGE_VALF;
  int64_t j = 0;
  if (N % 4 == 0) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    // four running maxima: one would wait on its own latency every vector
    auto m0 = hn::Set(d, -HUGE_VALF), m1 = m0, m2 = m0, m3 = m0;
    for (; j + 4 * N <= total; j += 4 * N) {
      m0 = hn::Max(m0, hn::LoadU(d, s4 + j));
      m1 = hn::Max(m1, hn::LoadU(d, s4 + j + N));
      m2 = hn::Max(m2, hn::LoadU(d, s4 + j + 2 * N));
      m3 = hn::Max(m3, hn::LoadU(d, s4 + j + 3 * N));
    }
    for (; j + N <= total; j += N) m0 = hn::Max(m0, hn::LoadU(d, s4 + j));
    hn::Store(hn::Max(hn::Max(m0, m1), hn::Max(m2, m3)), d, lanes);
    for (int64_t t = 0; t < N; ++t) m4[t % 4] = std::max(m4[t % 4], lanes[t]);
  }
  for (; j < total; ++j) m4[j % 4] = std::max(m4[j % 4], s4[j]);
}

// The anchor scores (QuadAnchorScores) and their maxima per query (QuadMax).
// AVX-512: four entries per vector, their table rows inserted as blocks, the
// maxima taken on the way (no second pass over the scores).
void QuadAnchorScoresMax(const float* HWY_RESTRICT T, const int32_t* HWY_RESTRICT ak,
                         const float* HWY_RESTRICT gk, int64_t n, float* HWY_RESTRICT s4, float* HWY_RESTRICT m4) {
#if ANCHORKV_AVX512_TARGET
  auto four = [&](int64_t e) {
    __m512 t = _mm512_castps128_ps512(_mm_loadu_ps(T + int64_t{ak[e]} * 4));  // 64-bit: see QuadExpScatter
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 1]} * 4), 1);
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 2]} * 4), 2);
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 3]} * 4), 3);
    const __m512 v = _mm512_mul_ps(t, SpreadFour(gk + e).raw);
    _mm512_storeu_ps(s4 + e * 4, v);
    return v;
  };
  __m512 mx0 = _mm512_set1_ps(-HUGE_VALF), mx1 = mx0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    mx0 = _mm512_max_ps(mx0, four(i));
    mx1 = _mm512_max_ps(mx1, four(i + 4));
  }
  for (; i + 4 <= n; i += 4) mx0 = _mm512_max_ps(mx0, four(i));
  const __m512 m = _mm512_max_ps(mx0, mx1);  // lane l holds query l % 4
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
  _mm_storeu_ps(m4, _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  for (; i < n; ++i)
    for (int g = 0; g < 4; ++g) m4[g] = std::max(m4[g], s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g]);
#else
  QuadAnchorScores(T, ak, gk, n, s4);
  QuadMax(s4, n, m4);
#endif
}

// W[av[i] * 4 + g] += p4[i * 4 + g] * gv[i]: value weights per anchor, one
// 4-lane add per entry. Even entries go to W0, odd ones to W1, so neighbours
// that share an anchor do not wait on each other through memory.
void QuadScatter(const float* HWY_RESTRICT p4, const int32_t* HWY_RESTRICT av, const float* HWY_RESTRICT gv,
                 int64_t n, float* HWY_RESTRICT W0, float* HWY_RESTRICT W1) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) (i % 2 ? W1 : W0)[av[i] * 4 + g] += p4[i * 4 + g] * gv[i];
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    float* a = W0 + av[i] * 4;
    float* b = W1 + av[i + 1] * 4;
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4), hn::Set(d4, gv[i]), hn::LoadU(d4, a)), d4, a);
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4 + 4), hn::Set(d4, gv[i + 1]), hn::LoadU(d4, b)), d4, b);
  }
  if (i < n) {
    float* a = W0 + av[i] * 4;
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4), hn::Set(d4, gv[i]), hn::LoadU(d4, a)), d4, a);
  }
}

// The softmax's exps and the value weights in one pass: s4 = exp(s4 - m4)
// (scores finite, at most kHeadroom above m4), l4[g] = sum of query g's, and
// QuadScatter's W0 / W1. AVX-512: four entries per vector; the exps keep the
// vector units busy while the scatter's read-modify-writes wait on memory,
// and one line of `ahead` is requested per four entries.
void QuadExpScatter(float* HWY_RESTRICT s4, int64_t n, const float* HWY_RESTRICT m4, float* HWY_RESTRICT l4,
                    const int32_t* HWY_RESTRICT av, const float* HWY_RESTRICT gv, float* HWY_RESTRICT W0,
                    float* HWY_RESTRICT W1, LinesAhead* HWY_RESTRICT ahead) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int g = 0; g < 4; ++g) l4[g] = 0;
  int64_t i = 0;
#if ANCHORKV_AVX512_TARGET
  const auto vm = hn::Vec<DF>{_mm512_broadcast_f32x4(_mm_loadu_ps(m4))};
  auto vsum = hn::Zero(d);
  for (; i + 4 <= n; i += 4) {
    ahead->request_one();
    const auto e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s4 + i * 4), vm));
    hn::StoreU(e, d, s4 + i * 4);
    vsum = hn::Add(vsum, e);
    const __m512 pv = _mm512_mul_ps(e.raw, SpreadFour(gv + i).raw);
    // 64-bit offsets: an int32 ordinal scaled in 32 bits cost a sign extension per entry
    float *w0 = W0 + int64_t{av[i]} * 4, *w1 = W1 + int64_t{av[i + 1]} * 4;
    _mm_storeu_ps(w0, _mm_add_ps(_mm_loadu_ps(w0), _mm512_castps512_ps128(pv)));
    _mm_storeu_ps(w1, _mm_add_ps(_mm_loadu_ps(w1), _mm512_extractf32x4_ps(pv, 1)));
    float *w2 = W0 + int64_t{av[i + 2]} * 4, *w3 = W1 + int64_t{av[i + 3]} * 4;
    _mm_storeu_ps(w2, _mm_add_ps(_mm_loadu_ps(w2), _mm512_extractf32x4_ps(pv, 2)));
    _mm_storeu_ps(w3, _mm_add_ps(_mm_loadu_ps(w3), _mm512_extractf32x4_ps(pv, 3)));
  }
  HWY_ALIGN float lanes[16];
  hn::Store(vsum, d, lanes);
  for (int64_t t = 0; t < 16; ++t) l4[t % 4] += lanes[t];
  for (; i < n; ++i)
    for (int g = 0; g < 4; ++g) {
      const float p = s4[i * 4 + g] = std::exp(s4[i * 4 + g] - m4[g]);
      l4[g] += p;
      (i % 2 ? W1 : W0)[av[i] * 4 + g] += p * gv[i];
    }
  (void)N;
#else
  const int64_t total = 4 * n;
  int64_t j = 0;
  if (N % 4 == 0) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    for (int64_t t = 0; t < N; ++t) lanes[t] = m4[t % 4];
    const auto vm = hn::Load(d, lanes);
    auto vsum = hn::Zero(d);
    for (; j + N <= total; j += N) {
      const auto e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s4 + j), vm));
      hn::StoreU(e, d, s4 + j);
      vsum = hn::Add(vsum, e);
    }
    hn::Store(vsum, d, lanes);
    for (int64_t t = 0; t < N; ++t) l4[t % 4] += lanes[t];
  }
  for (; j < total; ++j) l4[j % 4] += (s4[j] = std::exp(s4[j] - m4[j % 4]));
  QuadScatter(s4, av, gv, n, W0, W1);
  (void)i, (void)ahead;
#endif
}

// A quad's anchor weights back to one row per query: w[g * k + j] =
// W0[j * 4 + g] + W1[j * 4 + g] for g < gn.
void SumQuadWeights(const float* HWY_RESTRICT W0, const float* HWY_RESTRICT W1, int64_t k, int64_t gn,
                    float* HWY_RESTRICT w) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= k; j += N) {
    hn::Vec<DF> a0, a1, a2, a3, b0, b1, b2, b3;
    hn::LoadInterleaved4(d, W0 + j * 4, a0, a1, a2, a3);
    hn::LoadInterleaved4(d, W1 + j * 4, b0, b1, b2, b3);
    if (gn > 0) hn::StoreU(hn::Add(a0, b0), d, w + j);
    if (gn > 1) hn::StoreU(hn::Add(a1, b1), d, w + k + j);
    if (gn > 2) hn::StoreU(hn::Add(a2, b2), d, w + 2 * k + j);
    if (gn > 3) hn::StoreU(hn::Add(a3, b3), d, w + 3 * k + j);
  }
  for (; j < k; ++j)
    for (int64_t g = 0; g < gn; ++g) w[g * k + j] = W0[j * 4 + g] + W1[j * 4 + g];
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_QUAD_INL_H_
