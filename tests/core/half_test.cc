#include "core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/rng.h"

namespace anchorkv::core {
namespace {

TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << "half bits " << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // rounds to +Inf (half-way, even)
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3C00);  // tie -> even
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3C02);  // tie -> even (up)
  EXPECT_FLOAT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(bf16_to_float(0x3F80), 1.0f);
}

// The CPU's own float -> fp16 conversion (round to nearest even), where it has one.
#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t hw_convert(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
bool has_hw_convert() { return __builtin_cpu_supports("f16c"); }
#elif defined(__aarch64__)
uint16_t hw_convert(float f) {  // FCVT: every AArch64 CPU has it
  const __fp16 h = static_cast<__fp16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
bool has_hw_convert() { return true; }
#else
uint16_t hw_convert(float) { return 0; }
bool has_hw_convert() { return false; }
#endif

TEST(Half, MatchesHardwareConversion) {
  if (!has_hw_convert()) GTEST_SKIP() << "CPU has no fp16 conversion; nothing to compare against";
  Rng rng(1);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.next());
    const float f = f32_from_bits(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), hw_convert(f)) << "float bits " << bits;
  }
  // Dense sweep around the fp16 range and subnormals.
  for (float f = 1e-9f; f < 70000.0f; f *= 1.0001f) ASSERT_EQ(float_to_half(f), hw_convert(f)) << f;
}

}  // namespace
}  // namespace anchorkv::core
