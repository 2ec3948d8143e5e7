#include "compress/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/bitpack.h"
#include "core/half.h"
#include "core/rng.h"

namespace anchorkv::compress {
namespace {

double gaussian(core::Rng& rng) {
  return std::sqrt(-2.0 * std::log(std::max(rng.uniform(), 1e-300))) * std::cos(6.283185307179586 * rng.uniform());
}

double relative_mse(int64_t D, int bits, ResidualScale scale, int n = 500) {
  ResidualCodec codec(D, bits, scale, 42);
  core::Rng rng(1);
  std::vector<float> r(D), out(D), scratch(2 * D);
  std::vector<uint8_t> codes(codec.code_bytes()), tmp(D);
  double err = 0, en = 0;
  for (int i = 0; i < n; ++i) {
    for (auto& x : r) x = static_cast<float>(gaussian(rng));
    uint16_t s;
    codec.encode(r.data(), codes.data(), &s, scratch.data());
    codec.decode(codes.data(), s, out.data(), tmp.data());
    for (int64_t d = 0; d < D; ++d) {
      err += (r[d] - out[d]) * static_cast<double>(r[d] - out[d]);
      en += r[d] * static_cast<double>(r[d]);
    }
  }
  return err / en;
}

TEST(Codec, RmsScaleReachesLloydMaxDistortionOnGaussians) {
  // The Lloyd-Max MSE of N(0,1): 0.3634, 0.1175, 0.03454, 0.009497 for 1..4 bits.
  const double expected[] = {0.3634, 0.1175, 0.03454, 0.009497};
  for (int bits = 1; bits <= 4; ++bits)
    for (int64_t D : {64, 128, 80})
      EXPECT_NEAR(relative_mse(D, bits, ResidualScale::kRms), expected[bits - 1], 0.25 * expected[bits - 1])
          << "bits " << bits << " D " << D;
}

TEST(Codec, AbsmaxScaleIsWorseOnGaussians) {
  for (int bits = 1; bits <= 4; ++bits)
    EXPECT_GT(relative_mse(128, bits, ResidualScale::kAbsMax), relative_mse(128, bits, ResidualScale::kRms)) << bits;
}

TEST(Codec, ZeroResidualDecodesToZero) {
  for (int64_t D : {17, 64}) {
    ResidualCodec codec(D, 2, ResidualScale::kRms, 1);
    std::vector<float> r(D, 0.0f), out(D, 1.0f), scratch(2 * D);
    std::vector<uint8_t> codes(codec.code_bytes()), tmp(D);
    uint16_t s;
    codec.encode(r.data(), codes.data(), &s, scratch.data());
    EXPECT_EQ(s, 0);
    codec.decode(codes.data(), s, out.data(), tmp.data());
    for (float x : out) EXPECT_EQ(x, 0.0f);
  }
}

TEST(Codec, ScaleIsStoredAsFp16AndUsed) {
  const int64_t D = 64;
  ResidualCodec codec(D, 4, ResidualScale::kAbsMax, 3);
  std::vector<float> r(D), z(D), scratch(2 * D), rot(D);
  std::vector<uint8_t> codes(codec.code_bytes()), tmp(D);
  for (int64_t d = 0; d < D; ++d) r[d] = std::sin(static_cast<float>(d));
  uint16_t s;
  codec.encode(r.data(), codes.data(), &s, scratch.data());
  codec.rotation().forward(r.data(), z.data());
  float mx = 0;
  for (float x : z) mx = std::max(mx, std::fabs(x));
  EXPECT_EQ(s, core::float_to_half(mx));
  codec.decode_rotated(codes.data(), s, rot.data(), tmp.data());
  for (int64_t d = 0; d < D; ++d) EXPECT_LE(std::fabs(rot[d]), core::half_to_float(s) * 2.7326f + 1e-6f);
}

TEST(Codec, HugeResidualSaturatesScaleInsteadOfInf) {
  const int64_t D = 64;
  ResidualCodec codec(D, 2, ResidualScale::kAbsMax, 3);
  std::vector<float> r(D, 0.0f), scratch(2 * D);
  r[0] = 65504.0f * 8;
  std::vector<uint8_t> codes(codec.code_bytes());
  uint16_t s;
  codec.encode(r.data(), codes.data(), &s, scratch.data());
  EXPECT_TRUE(std::isfinite(core::half_to_float(s)));
}

}  // namespace
}  // namespace anchorkv::compress

namespace anchorkv::compress {
namespace {

TEST(Codec, LookupDecodeEqualsGenericUnpack) {
  // decode_rotated's per-byte table must give exactly level[code] * scale.
  for (int bits = 1; bits <= 4; ++bits)
    for (int64_t D : {17, 64, 80, 128}) {
      ResidualCodec codec(D, bits, ResidualScale::kRms, 5);
      core::Rng rng(static_cast<uint64_t>(bits * 1000 + D));
      std::vector<uint8_t> codes(static_cast<size_t>(D)), packed(codec.code_bytes()), tmp(D);
      for (auto& c : codes) c = static_cast<uint8_t>(rng.below(1u << bits));
      core::pack_codes(codes.data(), D, bits, packed.data());
      const uint16_t s = core::float_to_half(0.37f);
      std::vector<float> out(D);
      codec.decode_rotated(packed.data(), s, out.data(), tmp.data());
      for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out[d], core::half_to_float(s) * codec.levels()[codes[d]]);
    }
}

TEST(Codec, RunDecodeEqualsOneCodeAtATime) {
  // decode_levels_run: one stream where codes end on bytes, per code otherwise; the same levels either way.
  for (int bits = 1; bits <= 4; ++bits)
    for (int64_t D : {7, 12, 64, 80, 96, 128}) {
      ResidualCodec codec(D, bits, ResidualScale::kRms, 5);
      const int64_t n = 37, cb = codec.code_bytes();
      core::Rng rng(static_cast<uint64_t>(bits * 100 + D));
      std::vector<uint8_t> codes(static_cast<size_t>(D)), packed(static_cast<size_t>(n * cb)),
          tmp(static_cast<size_t>(n * D));
      for (int64_t t = 0; t < n; ++t) {
        for (auto& c : codes) c = static_cast<uint8_t>(rng.below(1u << bits));
        core::pack_codes(codes.data(), D, bits, &packed[t * cb]);
      }
      std::vector<float> one(static_cast<size_t>(n * D)), run(one.size());
      for (int64_t t = 0; t < n; ++t) codec.decode_levels(&packed[t * cb], &one[t * D], tmp.data());
      codec.decode_levels_run(packed.data(), n, run.data(), tmp.data());
      ASSERT_EQ(run, one) << bits << " bits, D " << D;
    }
}

}  // namespace
}  // namespace anchorkv::compress
