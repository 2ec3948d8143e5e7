// Attention ops: fp16 rows used in place (anchors and dense tokens): dot
// products and weighted sums without an f32 copy.
// A per-target "-inl.h" header of kernels/attention_kernels.cc (the only
// file that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_F16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_F16_INL_H_
#undef ANCHORKV_KERNELS_OPS_F16_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_F16_INL_H_
#endif

#include "hwy/highway.h"
#include "kernels/ops_reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// ---- fp16 anchors used in place (no f32 copy per call).

bool SupportsF16Rows(int64_t D) {
#if ANCHORKV_HW_F16
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return D % N == 0 && D / N <= 8;
#else
  (void)D;
  return false;
#endif
}

#if ANCHORKV_HW_F16
// out[g, j] = q[g] . A[j] for queries [g0, g1) and rows [j0, j1), one row at a time.
HWY_INLINE void DotRowsF16Range(const float* HWY_RESTRICT q, int64_t g0, int64_t g1, const hwy::float16_t* a16,
                                int64_t j0, int64_t j1, int64_t k, int64_t D, float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t g = g0; g < g1; g += 4) {
      const int64_t gn = g1 - g < 4 ? g1 - g : 4;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (int64_t d = 0; d < D; d += N) {
        const auto a = hn::PromoteTo(df, hn::LoadU(dh, a16 + j * D + d));
        a0 = hn::MulAdd(hn::LoadU(df, q + g * D + d), a, a0);
        if (gn > 1) a1 = hn::MulAdd(hn::LoadU(df, q + (g + 1) * D + d), a, a1);
        if (gn > 2) a2 = hn::MulAdd(hn::LoadU(df, q + (g + 2) * D + d), a, a2);
        if (gn > 3) a3 = hn::MulAdd(hn::LoadU(df, q + (g + 3) * D + d), a, a3);
      }
      out[g * k + j] = hn::GetLane(hn::SumOfLanes(df, a0));
      if (gn > 1) out[(g + 1) * k + j] = hn::GetLane(hn::SumOfLanes(df, a1));
      if (gn > 2) out[(g + 2) * k + j] = hn::GetLane(hn::SumOfLanes(df, a2));
      if (gn > 3) out[(g + 3) * k + j] = hn::GetLane(hn::SumOfLanes(df, a3));
    }
  }
}
#endif

// out[g, j] = q[g] . A[j] for fp16 rows A [k, D] (SupportsF16Rows(D)).
void DotRowsF16(const float* HWY_RESTRICT q, int64_t nq, const uint16_t* HWY_RESTRICT A16, int64_t k,
                int64_t D, float* HWY_RESTRICT out) {
#if ANCHORKV_HW_F16
  const auto* a16 = reinterpret_cast<const hwy::float16_t*>(A16);
  int64_t g0 = 0, j4 = 0;
#if ANCHORKV_AVX512_TARGET
  // Four rows by four queries at a time, their 16 sums in one SumsOf16 (a
  // reduction per row and query was most of the work).
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  j4 = k / 4 * 4;
  for (; g0 + 4 <= nq; g0 += 4) {
    const float* qg = q + g0 * D;
    for (int64_t j = 0; j < j4; j += 4) {
      if (j + 20 <= k)  // the four rows 16 on (from memory in a decode step)
        for (int64_t b = 0; b < 4 * D * 2; b += 64) __builtin_prefetch(a16 + (j + 16) * D + b / 2);
      hn::Vec<DF> acc[16];
      for (auto& a : acc) a = hn::Zero(df);
      for (int64_t d = 0; d < D; d += N) {
        const auto q0 = hn::LoadU(df, qg + d), q1 = hn::LoadU(df, qg + D + d);
        const auto q2 = hn::LoadU(df, qg + 2 * D + d), q3 = hn::LoadU(df, qg + 3 * D + d);
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          const auto a = hn::PromoteTo(df, hn::LoadU(dh, a16 + (j + e) * D + d));
          acc[e * 4] = hn::MulAdd(q0, a, acc[e * 4]);
          acc[e * 4 + 1] = hn::MulAdd(q1, a, acc[e * 4 + 1]);
          acc[e * 4 + 2] = hn::MulAdd(q2, a, acc[e * 4 + 2]);
          acc[e * 4 + 3] = hn::MulAdd(q3, a, acc[e * 4 + 3]);
        }
      }
      alignas(64) float sums[16];  // [row e][query g]
      hn::Store(SumsOf16(acc), df, sums);
      for (int e = 0; e < 4; ++e)
        for (int g = 0; g < 4; ++g) out[(g0 + g) * k + j + e] = sums[e * 4 + g];
    }
  }
#endif
  DotRowsF16Range(q, 0, g0, a16, j4, k, k, D, out);   // the rows past the last group of four
  DotRowsF16Range(q, g0, nq, a16, 0, k, k, D, out);   // the queries past the last quad
#else
  (void)q, (void)nq, (void)A16, (void)k, (void)D, (void)out;
#endif
}

#if ANCHORKV_HW_F16
// Y[g] += sum_j W[g * ldw + j] * A[j, d0 : d0 + NB * N] for four queries:
// each converted row segment serves all four.
template <int NB>
HWY_INLINE void AccumulateRowsF16Quad(const float* const* HWY_RESTRICT w, int64_t k,
                                      const hwy::float16_t* HWY_RESTRICT a16, int64_t D, int64_t d0,
                                      float* const* HWY_RESTRICT y) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[4][NB];
  for (int g = 0; g < 4; ++g)
    for (int b = 0; b < NB; ++b) acc[g][b] = hn::LoadU(df, y[g] + d0 + b * N);
  for (int64_t j = 0; j < k; ++j) {
    hn::Vec<DF> a[NB];
    if (j + 16 < k)  // the strip 16 rows on (its lines come from memory in a decode step)
      for (int64_t b = 0; b < NB * N * 2; b += 64) __builtin_prefetch(a16 + (j + 16) * D + d0 + b / 2);
    for (int b = 0; b < NB; ++b) a[b] = hn::PromoteTo(df, hn::LoadU(dh, a16 + j * D + d0 + b * N));
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const auto wg = hn::Set(df, w[g][j]);
      for (int b = 0; b < NB; ++b) acc[g][b] = hn::MulAdd(wg, a[b], acc[g][b]);
    }
  }
  for (int g = 0; g < 4; ++g)
    for (int b = 0; b < NB; ++b) hn::StoreU(acc[g][b], df, y[g] + d0 + b * N);
}
#endif

// Y[g * ldy + :D] += sum_j W[g * ldw + j] * A[j] for g < nq, fp16 rows A
// [k, D] (SupportsF16Rows(D)): quads of queries read each row once, in
// strips of up to four vectors (16 accumulators).
void AccumulateRowsF16Queries(const float* HWY_RESTRICT W, int64_t ldw, int64_t nq, int64_t k,
                              const uint16_t* HWY_RESTRICT A16, int64_t D, float* HWY_RESTRICT Y, int64_t ldy) {
#if ANCHORKV_HW_F16
  const auto* a16 = reinterpret_cast<const hwy::float16_t*>(A16);
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  thread_local std::vector<float> zero_w, spare_y;  // the lanes of a partial quad
  if (nq % 4 != 0) {
    zero_w.assign(static_cast<size_t>(k), 0.0f);
    spare_y.resize(static_cast<size_t>(D));
  }
  for (int64_t g0 = 0; g0 < nq; g0 += 4) {
    const float* w[4];
    float* y[4];
    for (int64_t g = 0; g < 4; ++g) {
      const bool real = g0 + g < nq;
      w[g] = real ? W + (g0 + g) * ldw : zero_w.data();
      y[g] = real ? Y + (g0 + g) * ldy : spare_y.data();
    }
    for (int64_t d0 = 0; d0 < D; d0 += 4 * N) {
      switch ((D - d0) / N) {
        case 1:
          AccumulateRowsF16Quad<1>(w, k, a16, D, d0, y);
          break;
        case 2:
          AccumulateRowsF16Quad<2>(w, k, a16, D, d0, y);
          break;
        case 3:
          AccumulateRowsF16Quad<3>(w, k, a16, D, d0, y);
          break;
        default:
          AccumulateRowsF16Quad<4>(w, k, a16, D, d0, y);
      }
    }
  }
#else
  (void)W, (void)ldw, (void)nq, (void)k, (void)A16, (void)D, (void)Y, (void)ldy;
#endif
}

float MaxOf(const float* HWY_RESTRICT x, int64_t n) { return core::HWY_NAMESPACE::MaxSpan(DF(), x, n); }

#if ANCHORKV_HW_F16
// acc[g, :] = sum_i p[g, i] * V[i, :] for D = NB vectors, two queries at a time.
template <int NB>
HWY_INLINE void ValuesTwoQueries(const float* HWY_RESTRICT s, int64_t nq, int64_t n, const uint16_t* V16,
                                 float* HWY_RESTRICT acc) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), D = NB * N;
  const auto* v16 = reinterpret_cast<const hwy::float16_t*>(V16);
  for (int64_t g0 = 0; g0 < nq; g0 += 2) {
    const float* p0 = s + g0 * n;
    const float* p1 = g0 + 1 < nq ? p0 + n : p0;
    hn::Vec<DF> a0[NB], a1[NB];
    for (int b = 0; b < NB; ++b) a0[b] = a1[b] = hn::Zero(df);
    for (int64_t i = 0; i < n; ++i) {
      hwy::Prefetch(v16 + (i + 8) * D);
      const auto w0 = hn::Set(df, p0[i]), w1 = hn::Set(df, p1[i]);
      for (int b = 0; b < NB; ++b) {
        const auto v = hn::PromoteTo(df, hn::LoadU(dh, v16 + i * D + b * N));
        a0[b] = hn::MulAdd(w0, v, a0[b]);
        a1[b] = hn::MulAdd(w1, v, a1[b]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      hn::StoreU(a0[b], df, acc + g0 * D + b * N);
      if (g0 + 1 < nq) hn::StoreU(a1[b], df, acc + (g0 + 1) * D + b * N);
    }
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_F16_INL_H_
