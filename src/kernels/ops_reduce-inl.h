// Attention ops: fp16 promotion, dot products, maxima, exp sums, gathers and
// scatters of scores (the reductions every kernel uses).
// A per-target "-inl.h" header of kernels/attention_kernels.cc (the only
// file that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_REDUCE_INL_H_
#undef ANCHORKV_KERNELS_OPS_REDUCE_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_REDUCE_INL_H_
#endif

#include "hwy/highway.h"
#include "core/simd-inl.h"
#include "kernels/kernel_types.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// fp16 promotion and dot products shared with core (core/simd-inl.h).
HWY_INLINE void ToF32(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n) {
  core::HWY_NAMESPACE::F16ToF32Span(in, out, n);
}
HWY_INLINE float Dot(const float* HWY_RESTRICT x, const float* HWY_RESTRICT y, int64_t D) {
  return core::HWY_NAMESPACE::Dot1(DF(), x, y, D);
}
using core::HWY_NAMESPACE::ExpNonPositive;
using core::HWY_NAMESPACE::HadamardWithin;
using core::HWY_NAMESPACE::RotatePairs;

float ExpShiftSum(float* HWY_RESTRICT x, int64_t n, float m) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  if (i < n) {
    const auto mask = hn::FirstN(d, static_cast<size_t>(n - i));
    // Masked-off lanes read as -inf - m -> exp = 0.
    const auto v = hn::IfThenElse(mask, core::HWY_NAMESPACE::LoadTail(d, x + i, n - i), hn::Set(d, -HUGE_VALF));
    const auto e = hn::Exp(d, hn::Sub(v, vm));
    hn::BlendedStore(e, mask, d, x + i);
    sum = hn::Add(sum, hn::IfThenElseZero(mask, e));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// out[i] = scale[i] * table[idx[i]]: the anchor scores of n tokens (vector gathers).
void GatherScaled(const float* HWY_RESTRICT table, const int32_t* HWY_RESTRICT idx,
                  const float* HWY_RESTRICT scale, int64_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, scale + i), hn::GatherIndex(df, table, hn::LoadU(di, idx + i))), df,
               out + i);
  for (; i < n; ++i) out[i] = scale[i] * table[idx[i]];
}

// Per-anchor value weights across the query group: W[idx[i] * 4 + g] += P[i * 4 + g]
// for a group of 4 queries, one 4-lane add per token. Tokens alternate between two
// accumulators, so neighbours that share an anchor do not wait on each other.
void ScatterAdd4(const float* HWY_RESTRICT P, const int32_t* HWY_RESTRICT idx, int64_t n,
                 float* HWY_RESTRICT W0, float* HWY_RESTRICT W1) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) W0[idx[i] * 4 + g] += P[i * 4 + g];
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    float* a = W0 + idx[i] * 4;
    float* b = W1 + idx[i + 1] * 4;
    hn::StoreU(hn::Add(hn::LoadU(d4, a), hn::LoadU(d4, P + i * 4)), d4, a);
    hn::StoreU(hn::Add(hn::LoadU(d4, b), hn::LoadU(d4, P + i * 4 + 4)), d4, b);
  }
  for (; i < n; ++i) {
    float* a = W0 + idx[i] * 4;
    hn::StoreU(hn::Add(hn::LoadU(d4, a), hn::LoadU(d4, P + i * 4)), d4, a);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_REDUCE_INL_H_
