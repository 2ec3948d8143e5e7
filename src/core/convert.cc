#include "core/convert.h"

#include <cmath>

#include "core/half.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ANCHORKV_HW_F16 and F16ToF32Span: core/simd-inl.h.

void F32ToF16(const float* HWY_RESTRICT in, uint16_t* HWY_RESTRICT out, int64_t n) {
  int64_t i = 0;
#if ANCHORKV_HW_F16
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto* o = reinterpret_cast<hwy::float16_t*>(out);
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, in + i)), dh, o + i);
#endif
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}

void F16ToF32(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n) { F16ToF32Span(in, out, n); }

void RoundToF16(const float* in, float* out, int64_t n) {
  int64_t i = 0;
#if ANCHORKV_HW_F16
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(df, hn::DemoteTo(dh, hn::LoadU(df, in + i))), df, out + i);
#endif
  for (; i < n; ++i) out[i] = round_to_half(in[i]);
}

int64_t FindOutsideF16(const float* HWY_RESTRICT in, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto limit = hn::Set(df, kFp16Max);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, in + i);
    // !(|v| <= limit) is true for NaN too.
    const auto ok = hn::Le(hn::Abs(v), limit);
    if (!hn::AllTrue(df, ok)) break;
  }
  for (; i < n; ++i)
    if (!(std::fabs(in[i]) <= kFp16Max)) return i;
  return -1;
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::core {
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F16ToF32);
HWY_EXPORT(RoundToF16);
HWY_EXPORT(FindOutsideF16);

void f32_to_f16_n(const float* in, uint16_t* out, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToF16)(in, out, n); }
void f16_to_f32_n(const uint16_t* in, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(F16ToF32)(in, out, n); }
void round_to_f16_n(const float* in, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(RoundToF16)(in, out, n); }
int64_t find_outside_fp16(const float* in, int64_t n) { return HWY_DYNAMIC_DISPATCH(FindOutsideF16)(in, n); }
int64_t find_outside_fp16_ref(const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!(std::fabs(in[i]) <= kFp16Max)) return i;
  return -1;
}
}  // namespace anchorkv::core
#endif
