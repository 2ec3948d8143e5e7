// Attention ops: fp16 promotion, dot products, maxima, exp sums, gathers and
// scatters of scores, sums across vectors (the reductions every kernel uses).
// A per-target "-inl.h" header of kernels/attention_kernels.cc and
// kernels/quad_entries.cc: its guard toggles once per Highway target, and
// its functions are inline, so the two units may each compile them.
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

inline float ExpShiftSum(float* HWY_RESTRICT x, int64_t n, float m) {
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
inline void GatherScaled(const float* HWY_RESTRICT table, const int32_t* HWY_RESTRICT idx,
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
inline void ScatterAdd4(const float* HWY_RESTRICT P, const int32_t* HWY_RESTRICT idx, int64_t n,
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

// ---- Sums across vectors: several dots' lanes folded into one vector.

#if HWY_TARGET != HWY_SCALAR
// A vector folded to one 128-bit block of partial sums.
template <class D>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> FoldToBlock(D d, hn::Vec<D> v) {
#if HWY_HAVE_SCALABLE
  // SVE: the lanes are known at run time only (MaxLanes is an upper bound,
  // not the count), so the fold goes through memory: lane i of the block
  // sums the lanes i mod 4.
  HWY_ALIGN float lanes[hn::MaxLanes(D())];
  HWY_ALIGN float block[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  hn::Store(v, d, lanes);
  for (size_t i = 0; i < hn::Lanes(d); ++i) block[i % 4] += lanes[i];
  return hn::Load(hn::CappedTag<float, 4>(), block);
#else
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return FoldToBlock(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
#endif
}

// [sum(a0), sum(a1), sum(a2), sum(a3)] in one 4-lane vector (needs N >= 4).
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> SumsOf4(hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2,
                                                    hn::Vec<DF> a3) {
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const auto b0 = FoldToBlock(df, a0), b1 = FoldToBlock(df, a1), b2 = FoldToBlock(df, a2),
             b3 = FoldToBlock(df, a3);
  // [b0_0 + b0_2, b1_0 + b1_2, b0_1 + b0_3, b1_1 + b1_3] and the same for b2, b3
  const auto u01 = hn::Add(hn::InterleaveLower(d4, b0, b1), hn::InterleaveUpper(d4, b0, b1));
  const auto u23 = hn::Add(hn::InterleaveLower(d4, b2, b3), hn::InterleaveUpper(d4, b2, b3));
  return hn::Add(hn::ConcatLowerLower(d4, u23, u01), hn::ConcatUpperUpper(d4, u23, u01));
}
#endif

#if ANCHORKV_AVX512_TARGET
// The sums of 16 vectors of 16 lanes, in order, in one vector: [sum(a[0]), ..., sum(a[15])].
// Pairs of lanes, then of 64-bit halves, are added within each 128-bit block
// (each block then holds four sources' partial sums), then blocks are paired
// across vectors: 45 shuffles and adds for 16 sums, against 22 per 4 in SumsOf4.
HWY_INLINE hn::Vec<DF> SumsOf16(const hn::Vec<DF>* a) {
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  hn::Vec<DF> w[4];
  for (int m = 0; m < 4; ++m) {
    const auto* x = a + 4 * m;
    const auto u01 = hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
    const auto u23 = hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
    const auto lo = hn::InterleaveLower(d64, hn::BitCast(d64, u01), hn::BitCast(d64, u23));
    const auto hi = hn::InterleaveUpper(d64, hn::BitCast(d64, u01), hn::BitCast(d64, u23));
    w[m] = hn::Add(hn::BitCast(df, lo), hn::BitCast(df, hi));  // block b: four sources' partial sums
  }
  // Blocks 0, 2 of x and y plus their blocks 1, 3: half as many blocks per source.
  auto pair_blocks = [](hn::Vec<DF> x, hn::Vec<DF> y) {
    return hn::Vec<DF>{_mm512_add_ps(_mm512_shuffle_f32x4(x.raw, y.raw, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(x.raw, y.raw, _MM_SHUFFLE(3, 1, 3, 1)))};
  };
  return pair_blocks(pair_blocks(w[0], w[1]), pair_blocks(w[2], w[3]));
}

// [x[0] x 4, x[1] x 4, x[2] x 4, x[3] x 4]: four per-entry factors over an entry's four lanes.
HWY_INLINE hn::Vec<DF> SpreadFour(const float* HWY_RESTRICT x) {
  const DF df;
  alignas(64) static constexpr int32_t kSpread[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const auto x4 = hn::LoadU(hn::CappedTag<float, 4>(), x);
  return hn::TableLookupLanes(hn::ZeroExtendVector(df, hn::ZeroExtendVector(hn::Half<DF>(), x4)),
                              hn::SetTableIndices(df, kSpread));
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_REDUCE_INL_H_
