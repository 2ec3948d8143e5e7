// Per-target SIMD helpers shared by the Highway translation units
// (core/linalg.cc, core/convert.cc, core/rope.cc, kernels/attention_kernels.cc,
// kernels/causal_attention.cc). Include it
// after "hwy/highway.h" in a file compiled through hwy/foreach_target.h: the
// guard below toggles per target, the Highway "-inl.h" convention.
#if defined(ANCHORKV_CORE_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_CORE_SIMD_INL_H_
#undef ANCHORKV_CORE_SIMD_INL_H_
#else
#define ANCHORKV_CORE_SIMD_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "hwy/highway.h"

// Hardware fp16 conversion only where the ISA has it (F16C from AVX2 on,
// AVX-512); Highway's emulation on older targets rounds differently.
#undef ANCHORKV_HW_F16
#if HWY_TARGET <= HWY_AVX2 && HWY_TARGET != HWY_SCALAR && HWY_ARCH_X86
#define ANCHORKV_HW_F16 1
#else
#define ANCHORKV_HW_F16 0
#endif

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The first n (< Lanes(d)) elements at p in the low lanes, zeros above; p
// need not be aligned and nothing past p + n is read. (Highway 1.0's
// MaskedLoad is an aligned full-vector load below AVX2: it faulted on
// unaligned tails on SSE4 CPUs.)
template <class D>
HWY_INLINE hn::Vec<D> LoadTail(D d, const hn::TFromD<D>* HWY_RESTRICT p, int64_t n) {
  HWY_ALIGN hn::TFromD<D> buf[hn::MaxLanes(D())] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return hn::Load(d, buf);
}

// The butterfly stages of a Walsh-Hadamard transform within one vector
// (lanes 1, 2, 4, ... apart, up to Lanes(d) / 2), in that order: partner by a
// lane permutation, then x * (+-1) + partner, exactly the a + b or a - b of
// the scalar transform (core::fwht_ref), so the bits are the same.
template <class D>
struct HadamardWithin {
  static constexpr int kMaxStages = 5;  // up to 32 lanes
  explicit HadamardWithin(D d) {
    for (int64_t h = 1; h < static_cast<int64_t>(hn::Lanes(d)) && stages < kMaxStages; h <<= 1, ++stages) {
#if !HWY_HAVE_SCALABLE
      idx[stages] = Partners(d, h);
      sign[stages] = Signs(d, h);
#endif
    }
  }
  HWY_INLINE hn::Vec<D> apply(hn::Vec<D> v) const {
    for (int s = 0; s < stages; ++s) {
#if HWY_HAVE_SCALABLE  // sizeless SVE vectors cannot be members: formed per call
      const int64_t h = int64_t{1} << s;
      v = hn::MulAdd(v, Signs(D(), h), hn::TableLookupLanes(v, Partners(D(), h)));
#else
      v = hn::MulAdd(v, sign[s], hn::TableLookupLanes(v, idx[s]));
#endif
    }
    return v;
  }
  int stages = 0;

 private:
  // Lane i's partner, i ^ h.
  static HWY_INLINE auto Partners(D d, int64_t h) {
    const hn::RebindToSigned<D> di;
    return hn::IndicesFromVec(d, hn::Xor(hn::Iota(di, 0), hn::Set(di, static_cast<hn::TFromD<decltype(di)>>(h))));
  }
  // +1 where bit h of the lane is clear (a + b), -1 where it is set (a - b = -x + partner).
  static HWY_INLINE hn::Vec<D> Signs(D d, int64_t h) {
    const hn::RebindToSigned<D> di;
    const auto bit = hn::Set(di, static_cast<hn::TFromD<decltype(di)>>(h));
    return hn::IfThenElse(hn::RebindMask(d, hn::Eq(hn::And(hn::Iota(di, 0), bit), hn::Zero(di))), hn::Set(d, 1.0f),
                          hn::Set(d, -1.0f));
  }
#if !HWY_HAVE_SCALABLE
  decltype(hn::IndicesFromVec(D(), hn::Zero(hn::RebindToSigned<D>()))) idx[kMaxStages];
  hn::Vec<D> sign[kMaxStages];
#endif
};

// Pairs (x, y) rotated by angles with cosines c and sines s:
// (x c - y s, x s + y c). With (x, y) = (cos b, sin b) and (c, s) the cosines
// and sines of a, this is the angle sum: (cos(a + b), sin(a + b)).
template <class V>
HWY_INLINE void RotatePairs(V x, V y, V c, V s, V& rx, V& ry) {
  rx = hn::NegMulAdd(y, s, hn::Mul(x, c));
  ry = hn::MulAdd(x, s, hn::Mul(y, c));
}

// One dot product: lane-parallel FMA over D, zero-filled tail, then a lane sum.
template <class DF>
HWY_INLINE float Dot1(DF d, const float* HWY_RESTRICT x, const float* HWY_RESTRICT y, int64_t D) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= D; i += N) acc = hn::MulAdd(hn::LoadU(d, x + i), hn::LoadU(d, y + i), acc);
  if (i < D) acc = hn::MulAdd(LoadTail(d, x + i, D - i), LoadTail(d, y + i, D - i), acc);
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

// max of x[0, n) (-inf for n = 0).
template <class DF>
HWY_INLINE float MaxSpan(DF d, const float* HWY_RESTRICT x, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto vm = hn::Set(d, -HUGE_VALF);
  int64_t i = 0;
  for (; i + N <= n; i += N) vm = hn::Max(vm, hn::LoadU(d, x + i));
  float m = hn::GetLane(hn::MaxOfLanes(d, vm));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// fp16 bits -> float, exact.
HWY_INLINE void F16ToF32Span(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n) {
  int64_t i = 0;
#if ANCHORKV_HW_F16
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto* p = reinterpret_cast<const hwy::float16_t*>(in);
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, p + i)), df, out + i);
#endif
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

// exp(x) for x <= 0 (scores minus their maximum; also right up to x = 88,
// where 2^n stays normal), within 2.1 ulp of std::exp (1.25 with the Cephes
// expf polynomial this replaced): x = n ln2 + r with |r| <= ln2 / 2 (ln2
// split in two for an exact reduction), exp(r) by a degree-5 polynomial
// with exp(0) = 1 exactly (relative error 9.2e-8 on the interval; fitted
// for minimax relative error), 2^n through the exponent. Below -87 (where
// 2^n leaves the normal range) the result is 0 (exp < 2e-38). 11 vector
// operations where the Cephes form took 15 (the quad kernel's exp-and-scatter
// pass is about a fifth of a post-RoPE decode).
template <class DF>
HWY_INLINE hn::Vec<DF> ExpNonPositive(DF d, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const auto n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  auto r = hn::MulAdd(n, hn::Set(d, -0.693359375f), x);
  r = hn::MulAdd(n, hn::Set(d, 2.12194440e-4f), r);
  auto p = hn::Set(d, 0.008290319736808223f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.0418979505190344f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.16667636272614372f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.49999149376663304f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.9999997071288272f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const auto in_range = hn::Ge(x, hn::Set(d, -87.0f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // vscalefps: p * 2^n in one instruction (the same product: exact while
  // 2^n is normal), lanes out of range zeroed by its mask
  if constexpr (std::is_same_v<hn::Vec<DF>, hn::Vec512<float>>) {
    (void)di;
    return hn::Vec<DF>{_mm512_maskz_scalef_ps(in_range.raw, p.raw, n.raw)};
  }
#endif
  const auto two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenElseZero(in_range, hn::Mul(p, two_n));
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
