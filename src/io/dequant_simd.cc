// SIMD dequantization (Highway, runtime dispatch) of the block types real
// models use most: Q8_0, Q4_0, Q4_K, Q6_K. Same operations in the same order
// as the scalar reference in dequant.cc (multiply, then subtract; no fused
// multiply-add), so the results are bit-identical to it (tested).
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "io/dequant_simd.h"
#include "io/ggml_blocks.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "io/dequant_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::io {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return core::half_to_float(h);
}
}  // namespace

using DF = hn::ScalableTag<float>;
using DI = hn::Rebind<int32_t, DF>;

// N bytes -> N i32 lanes.
HWY_INLINE hn::Vec<DI> Bytes(const uint8_t* p) {
  return hn::PromoteTo(DI(), hn::LoadU(hn::Rebind<uint8_t, DF>(), p));
}

void DequantQ8_0(const uint8_t* HWY_RESTRICT src, int64_t nb, float* HWY_RESTRICT y) {
  const DF df;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t b = 0; b < nb; ++b, src += kQ8_0Block.bytes, y += kQ8_0Block.elems) {
    const auto d = hn::Set(df, f16_at(src));
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int64_t i = 0; i < 32; i += N)
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(d8, q + i)))), df, y + i);
  }
}

void DequantQ4_0(const uint8_t* HWY_RESTRICT src, int64_t nb, float* HWY_RESTRICT y) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto k15 = hn::Set(DI(), 15), k8 = hn::Set(DI(), 8);
  for (int64_t b = 0; b < nb; ++b, src += kQ4_0Block.bytes, y += kQ4_0Block.elems) {
    const auto d = hn::Set(df, f16_at(src));
    for (int64_t i = 0; i < 16; i += N) {
      const auto v = Bytes(src + 2 + i);
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hn::Sub(hn::And(v, k15), k8))), df, y + i);
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hn::Sub(hn::ShiftRight<4>(v), k8))), df, y + 16 + i);
    }
  }
}

// scale_min_k4 of dequant.cc: group g's 6-bit scale and min.
HWY_INLINE void ScaleMinK4(const uint8_t* sc, int g, int* s, int* m) {
  if (g < 4) {
    *s = sc[g] & 63;
    *m = sc[g + 4] & 63;
  } else {
    *s = (sc[g + 4] & 0xF) | ((sc[g - 4] >> 6) << 4);
    *m = (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4);
  }
}

void DequantQ4_K(const uint8_t* HWY_RESTRICT src, int64_t nb, float* HWY_RESTRICT y) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto k15 = hn::Set(DI(), 15);
  for (int64_t b = 0; b < nb; ++b, src += 144) {
    const float d = f16_at(src), dmin = f16_at(src + 2);
    const uint8_t* sc = src + 4;
    const uint8_t* ql = src + 16;
    for (int c = 0; c < 4; ++c, ql += 32, y += 64) {
      int s1, m1, s2, m2;
      ScaleMinK4(sc, 2 * c, &s1, &m1);
      ScaleMinK4(sc, 2 * c + 1, &s2, &m2);
      const auto d1 = hn::Set(df, d * static_cast<float>(s1)), o1 = hn::Set(df, dmin * static_cast<float>(m1));
      const auto d2 = hn::Set(df, d * static_cast<float>(s2)), o2 = hn::Set(df, dmin * static_cast<float>(m2));
      for (int64_t l = 0; l < 32; l += N) {
        const auto v = Bytes(ql + l);
        hn::StoreU(hn::Sub(hn::Mul(d1, hn::ConvertTo(df, hn::And(v, k15))), o1), df, y + l);
        hn::StoreU(hn::Sub(hn::Mul(d2, hn::ConvertTo(df, hn::ShiftRight<4>(v))), o2), df, y + 32 + l);
      }
    }
  }
}

void DequantQ6_K(const uint8_t* HWY_RESTRICT src, int64_t nb, float* HWY_RESTRICT y) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto k15 = hn::Set(DI(), 15), k3 = hn::Set(DI(), 3), k32 = hn::Set(DI(), 32);
  for (int64_t b = 0; b < nb; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = f16_at(src + 208);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8)
      for (int64_t l = 0; l < 32; l += N) {
        const int64_t is = l / 16;  // one scale per 16 lanes; N divides 16
        const auto a = Bytes(ql + l), a2 = Bytes(ql + l + 32), h = Bytes(qh + l);
        const auto q1 = hn::Sub(hn::Or(hn::And(a, k15), hn::ShiftLeft<4>(hn::And(h, k3))), k32);
        const auto q2 = hn::Sub(hn::Or(hn::And(a2, k15), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), k3))), k32);
        const auto q3 = hn::Sub(hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), k3))), k32);
        const auto q4 = hn::Sub(hn::Or(hn::ShiftRight<4>(a2), hn::ShiftLeft<4>(hn::ShiftRight<6>(h))), k32);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is])), hn::ConvertTo(df, q1)), df, y + l);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 2])), hn::ConvertTo(df, q2)), df, y + l + 32);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 4])), hn::ConvertTo(df, q3)), df, y + l + 64);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 6])), hn::ConvertTo(df, q4)), df, y + l + 96);
      }
  }
}

// false when this target's vectors are too wide for the block layout (the caller then uses the scalar path)
bool DequantBlocks(int type, const uint8_t* HWY_RESTRICT src, int64_t nb, float* HWY_RESTRICT y) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  if (N > 16 || 16 % N != 0) return false;
  switch (type) {
    case kSimdQ8_0: DequantQ8_0(src, nb, y); return true;
    case kSimdQ4_0: DequantQ4_0(src, nb, y); return true;
    case kSimdQ4_K: DequantQ4_K(src, nb, y); return true;
    case kSimdQ6_K: DequantQ6_K(src, nb, y); return true;
    default: return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::io
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::io {
HWY_EXPORT(DequantBlocks);
bool dequant_blocks_simd(int type, const uint8_t* src, int64_t n_blocks, float* dst) {
  return HWY_DYNAMIC_DISPATCH(DequantBlocks)(type, src, n_blocks, dst);
}
}  // namespace anchorkv::io
#endif
