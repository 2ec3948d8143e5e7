#include "core/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/rng.h"

namespace anchorkv::core {
namespace {

// Bulk SIMD conversions must give exactly the scalar reference's bits.
TEST(Convert, BulkConversionsMatchScalarReferenceBitForBit) {
  Rng rng(4);
  for (int64_t n : {0, 1, 7, 16, 17, 1000, 4099}) {
    std::vector<float> in(static_cast<size_t>(n));
    for (auto& x : in) {
      // Mix of normal values, tiny (subnormal-half) values and values near the range end.
      const double u = rng.uniform();
      x = static_cast<float>((rng.uniform() * 2 - 1) * (u < 0.3 ? 1e-6 : u < 0.6 ? 1.0 : 70000.0));
    }
    std::vector<uint16_t> fast(in.size()), ref(in.size());
    f32_to_f16_n(in.data(), fast.data(), n);
    float_to_half_n(in.data(), ref.data(), n);
    ASSERT_EQ(fast, ref) << n;
    std::vector<float> back(in.size()), back_ref(in.size());
    f16_to_f32_n(fast.data(), back.data(), n);
    half_to_float_n(fast.data(), back_ref.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32_bits(back[i]), f32_bits(back_ref[i]));
    std::vector<float> rounded(in.size());
    round_to_f16_n(in.data(), rounded.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32_bits(rounded[i]), f32_bits(round_to_half(in[i])));
  }
}

TEST(Convert, FindOutsideFp16FindsTheFirstBadValue) {
  for (int64_t n : {1, 5, 16, 33, 300}) {
    for (int64_t bad = 0; bad < n; bad += 7) {
      for (float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -65505.0f, 1e30f}) {
        std::vector<float> x(static_cast<size_t>(n), 65504.0f);
        x[bad] = v;
        if (bad + 3 < n) x[bad + 3] = v;  // only the first is reported
        ASSERT_EQ(find_outside_fp16(x.data(), n), bad);
        ASSERT_EQ(find_outside_fp16_ref(x.data(), n), bad);
      }
    }
    std::vector<float> ok(static_cast<size_t>(n), -65504.0f);
    EXPECT_EQ(find_outside_fp16(ok.data(), n), -1);
  }
}

}  // namespace
}  // namespace anchorkv::core
