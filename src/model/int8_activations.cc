// 8-bit activations (int8_activations.h): a Highway kernel per target and
// its scalar twin, bit-identical (tested).
#include "model/int8_activations.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/int8_activations.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace anchorkv::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens [t0, t1) of x quantized into `out` (sized by the caller).
void Quantize(const float* x, int64_t t0, int64_t t1, Int8Activations* out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> d16;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), G = out->group, cols = out->cols;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t g = 0; g < cols / G; ++g) {
      const float* xg = x + t * cols + g * G;
      int16_t* q = &out->q[static_cast<size_t>(t * cols + g * G)];
      int8_t* q8 = &out->q8[static_cast<size_t>(t * cols + g * G)];
      int32_t* sums = &out->sum[static_cast<size_t>((t * cols + g * G) / 32)];
      auto amax = hn::Zero(df);
      auto finite = hn::FirstN(df, N);
      for (int64_t i = 0; i < G; i += N) {
        const auto v = hn::LoadU(df, xg + i);
        amax = hn::Max(amax, hn::Abs(v));
        finite = hn::And(finite, hn::IsFinite(v));
      }
      const float m = hn::GetLane(hn::MaxOfLanes(df, amax));
      const bool finite_all = hn::AllTrue(df, finite);
      out->scale[static_cast<size_t>(t * (cols / G) + g)] = finite_all ? m / 127.0f : NAN;
      if (!finite_all || !(m > 0.0f)) {
        std::fill_n(q, G, int16_t{0});
        std::fill_n(q8, G, int8_t{0});
        std::fill_n(sums, G / 32, 0);
        continue;
      }
      const auto inv = hn::Set(df, 127.0f / m);
      for (int64_t k = 0; k < G; k += 32) {
        auto s = hn::Zero(di);
        for (int64_t i = k; i < k + 32; i += N) {
          const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + i), inv));
          s = hn::Add(s, qi);
          hn::StoreU(hn::DemoteTo(d16, qi), d16, q + i);
          hn::StoreU(hn::DemoteTo(d8, qi), d8, q8 + i);
        }
        sums[k / 32] = hn::GetLane(hn::SumOfLanes(di, s));
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::model {

HWY_EXPORT(Quantize);

namespace {
void size_activations(int64_t T, int64_t cols, int64_t group, Int8Activations* out) {
  if (group != 32 && group != 256)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::quantize_int8", "group must be 32 or 256");
  if (T < 0 || cols < 0 || cols % group != 0)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::quantize_int8",
               std::to_string(cols) + " columns is not a multiple of the group of " + std::to_string(group));
  out->T = T;
  out->cols = cols;
  out->group = group;
  out->q.resize(static_cast<size_t>(T * cols));
  out->q8.resize(static_cast<size_t>(T * cols));
  out->scale.resize(static_cast<size_t>(T * (cols / group)));
  out->sum.resize(static_cast<size_t>(T * (cols / 32)));
}
}  // namespace

void quantize_int8(const float* x, int64_t T, int64_t cols, int64_t group, Int8Activations* out,
                   int threads) {
  size_activations(T, cols, group, out);
  constexpr int64_t kTokensPerTask = 16;
  core::parallel_for((T + kTokensPerTask - 1) / kTokensPerTask, threads, [&](int64_t i) {
    HWY_DYNAMIC_DISPATCH(Quantize)(x, i * kTokensPerTask, std::min(T, (i + 1) * kTokensPerTask), out);
  });
}

void quantize_int8_ref(const float* x, int64_t T, int64_t cols, int64_t group, Int8Activations* out) {
  size_activations(T, cols, group, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* xg = x + t * cols + g * group;
      float m = 0.0f;
      bool finite = true;
      for (int64_t i = 0; i < group; ++i) {
        finite = finite && std::isfinite(xg[i]);
        m = std::max(m, std::fabs(xg[i]));
      }
      const bool ok = finite && m > 0.0f;
      out->scale[static_cast<size_t>(t * (cols / group) + g)] = finite ? m / 127.0f : NAN;
      const float inv = ok ? 127.0f / m : 0.0f;
      for (int64_t i = 0; i < group; ++i) {
        const float v = ok ? xg[i] * inv : 0.0f;
        const auto qi = static_cast<int16_t>(std::nearbyint(v));
        out->q[static_cast<size_t>(t * cols + g * group + i)] = qi;
        out->q8[static_cast<size_t>(t * cols + g * group + i)] = static_cast<int8_t>(qi);
      }
    }
  for (int64_t k = 0; k < T * cols / 32; ++k) {
    int32_t s = 0;
    for (int64_t i = 0; i < 32; ++i) s += out->q[static_cast<size_t>(k * 32 + i)];
    out->sum[static_cast<size_t>(k)] = s;
  }
}

}  // namespace anchorkv::model
#endif  // HWY_ONCE
