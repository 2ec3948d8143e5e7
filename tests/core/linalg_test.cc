#include "core/bitpack.h"
#include "core/linalg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"

namespace anchorkv::core {
namespace {

// SIMD vs scalar reference: |fast - ref| <= kSimdRelTol * sum_d |x_d y_d| (+ tiny).
constexpr double kSimdRelTol = 1e-5;

std::vector<float> random_vec(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 2 - 1);
  return v;
}

TEST(Linalg, DotMatrixMatchesReferenceOverSizesAndMisalignment) {
  Rng rng(5);
  for (int64_t D : {1, 3, 8, 15, 16, 17, 64, 80, 128, 130}) {
    for (int64_t n : {1, 3, 4, 5, 17}) {
      for (int64_t k : {1, 4, 7, 65}) {
        for (int64_t off : {0, 1}) {  // misaligned base pointers
          const int64_t ldx = D + 3, ldy = D + 1;
          auto X = random_vec(rng, static_cast<size_t>(n * ldx + off));
          auto Y = random_vec(rng, static_cast<size_t>(k * ldy + off));
          std::vector<float> fast(static_cast<size_t>(n * k)), ref(fast.size());
          dot_matrix(X.data() + off, n, ldx, Y.data() + off, k, ldy, D, fast.data(), k);
          dot_matrix_ref(X.data() + off, n, ldx, Y.data() + off, k, ldy, D, ref.data(), k);
          std::vector<float> dist(fast.size()), dist_ref(fast.size());
          sq_dist_matrix(X.data() + off, n, ldx, Y.data() + off, k, ldy, D, dist.data(), k);
          sq_dist_matrix_ref(X.data() + off, n, ldx, Y.data() + off, k, ldy, D, dist_ref.data(), k);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < k; ++j) {
              double mag = 0, dmag = 0;
              for (int64_t d = 0; d < D; ++d) {
                const double a = X[off + i * ldx + d], b = Y[off + j * ldy + d];
                mag += std::fabs(a * b);
                dmag += (a - b) * (a - b);
              }
              ASSERT_NEAR(fast[i * k + j], ref[i * k + j], kSimdRelTol * mag + 1e-12)
                  << "D=" << D << " n=" << n << " k=" << k << " off=" << off;
              ASSERT_NEAR(dist[i * k + j], dist_ref[i * k + j], kSimdRelTol * dmag + 1e-12);
            }
        }
      }
    }
  }
}

TEST(Linalg, DotMatrixElementDoesNotDependOnTilePosition) {
  // The same pair of rows gives bit-identical results whether computed in a
  // 4x4 tile or an edge loop: the basis of thread-count determinism.
  Rng rng(8);
  const int64_t D = 80, n = 9, k = 9;
  auto X = random_vec(rng, static_cast<size_t>(n * D));
  auto Y = random_vec(rng, static_cast<size_t>(k * D));
  std::vector<float> full(static_cast<size_t>(n * k));
  dot_matrix(X.data(), n, D, Y.data(), k, D, D, full.data(), k);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      float one;
      dot_matrix(X.data() + i * D, 1, D, Y.data() + j * D, 1, D, D, &one, 1);
      ASSERT_EQ(one, full[i * k + j]);
      ASSERT_EQ(dot(X.data() + i * D, Y.data() + j * D, D), one);
    }
}

TEST(Linalg, AxpyScaleAddAndDotMatchReference) {
  Rng rng(2);
  for (int64_t D : {1, 7, 16, 33, 128}) {
    auto x = random_vec(rng, static_cast<size_t>(D));
    auto y = random_vec(rng, static_cast<size_t>(D));
    auto y2 = y;
    axpy(0.37f, x.data(), y.data(), D);
    axpy_ref(0.37f, x.data(), y2.data(), D);
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(y[d], y2[d], 1e-6);
    for (const float* xs : std::initializer_list<const float*>{x.data(), nullptr}) {
      auto z = y, z2 = y;
      scale_add(0.61f, z.data(), 1.7f, xs, D);
      scale_add_ref(0.61f, z2.data(), 1.7f, xs, D);
      for (int64_t d = 0; d < D; ++d)
        EXPECT_NEAR(z[d], z2[d], 1e-6 * (1 + std::abs(z2[d]))) << D << " " << d << (xs ? "" : " (no x)");
      EXPECT_NE(z[D - 1], y[D - 1]);
    }
    EXPECT_NEAR(dot(x.data(), y.data(), D), dot_ref(x.data(), y.data(), D), 1e-5 * D);
  }
  EXPECT_NE(std::string(simd_target_name()), "");
}

// The fixed-order dot product is the order it states, bit for bit (a build
// that reassociated floats would break the paths that rely on it), and
// within rounding of the sequential sum.
TEST(Linalg, DotFixedOrderSumsEightPartialsPairwise) {
  Rng rng(3);
  for (int64_t D : {1, 7, 8, 64, 100, 128, 257}) {
    std::vector<float> x(static_cast<size_t>(D)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(rng.uniform() - 0.5);
      y[i] = static_cast<float>(rng.uniform() - 0.5);
    }
    float s[8] = {};
    for (int64_t i = 0; i < D; ++i) s[i % 8] = s[i % 8] + x[i] * y[i];
    const float expected = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    EXPECT_EQ(dot_fixed_order(x.data(), y.data(), D), expected) << D;
    EXPECT_NEAR(dot_fixed_order(x.data(), y.data(), D), dot_ref(x.data(), y.data(), D), 1e-5 * D) << D;
  }
}

// The multiply-add roof a benchmark prints: the vector width of the target
// that ran (16 lanes on AVX-512, 8 on AVX2, 4 on SSE4 and NEON, what the CPU
// chose on SVE: 128 to 2048 bits) and a rate no CPU can exceed (under 10 T
// lanes/s per thread) or fall below on a live machine.
TEST(Linalg, MultiplyAddRateIsMeasuredOnTheDispatchedTarget) {
  const MulAddRate one = measure_multiply_add_rate(1);
  const std::string target = simd_target_name();
  if (target == "SVE" || target == "SVE2") {
    EXPECT_TRUE(one.lanes >= 4 && one.lanes <= 64 && one.lanes % 4 == 0) << target << " " << one.lanes;
  } else {
    const bool emulated = target == "EMU128" || target == "SCALAR";
    const int64_t expected = target.rfind("AVX3", 0) == 0 ? 16
                             : target == "AVX2" || target == "SVE_256" ? 8
                             : emulated ? one.lanes : 4;
    EXPECT_EQ(one.lanes, expected) << target;
  }
  EXPECT_GT(one.lanes_per_second, 1e8);
  EXPECT_LT(one.lanes_per_second, 1e13);
}

// The softmax's exp: within 2.1 ulp of exp over the range of shifted
// scores (at most 16 above their shift), 1 at 0, 0 from -87 down.
TEST(Linalg, ExpScoresStaysWithinTwoUlp) {
  std::vector<float> x;
  for (double v = -87.0; v <= 16.0; v += 7.7e-5) x.push_back(static_cast<float>(v));
  x.push_back(0.0f);
  std::vector<float> y(x.size());
  exp_scores(x.data(), static_cast<int64_t>(x.size()), y.data());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    const float r = static_cast<float>(ref);
    const double ulp = std::nextafter(r, HUGE_VALF) - r;
    worst = std::max(worst, std::fabs(y[i] - ref) / ulp);
  }
  EXPECT_LE(worst, 2.1);
  EXPECT_EQ(y.back(), 1.0f);
  const std::vector<float> below = {-87.5f, -200.0f, -1e30f, -HUGE_VALF, -88.0f};  // 5: a vector's tail
  std::vector<float> zero(below.size(), 1.0f);
  exp_scores(below.data(), static_cast<int64_t>(below.size()), zero.data());
  for (float z : zero) EXPECT_EQ(z, 0.0f);
}

}  // namespace
}  // namespace anchorkv::core

namespace anchorkv::core {
namespace {

TEST(Linalg, AccumulateRowsMatchesReference) {
  Rng rng(5);
  for (int64_t D : {1, 15, 64, 80, 128, 200}) {
    for (int64_t n : {0, 1, 3, 40}) {
      const int64_t nq = 3, ldw = n + 2, ldo = D + 5;
      auto W = random_vec(rng, static_cast<size_t>(nq * ldw));
      auto Z = random_vec(rng, static_cast<size_t>(std::max<int64_t>(n, 1) * D));
      auto out = random_vec(rng, static_cast<size_t>(nq * ldo));
      auto ref = out;
      accumulate_rows(W.data(), ldw, Z.data(), n, nq, D, out.data(), ldo);
      accumulate_rows_ref(W.data(), ldw, Z.data(), n, nq, D, ref.data(), ldo);
      for (int64_t g = 0; g < nq; ++g)
        for (int64_t d = 0; d < ldo; ++d)  // the padding after D stays untouched
          ASSERT_NEAR(out[g * ldo + d], ref[g * ldo + d], kSimdRelTol * (1.0 + static_cast<double>(n)))
              << "D=" << D << " n=" << n << " g=" << g << " d=" << d;
    }
  }
}

TEST(Linalg, Decode2BitMatchesReference) {
  Rng rng(9);
  const float levels[4] = {-1.5f, -0.25f, 0.5f, 2.0f};
  for (int64_t D : {1, 3, 4, 16, 63, 64, 80, 128, 200}) {
    std::vector<uint8_t> codes(static_cast<size_t>((D + 3) / 4));
    for (auto& c : codes) c = static_cast<uint8_t>(rng.next() & 0xFF);
    std::vector<float> got(static_cast<size_t>(D)), ref(got.size());
    decode_codes_2bit(codes.data(), levels, D, got.data());
    decode_codes_2bit_ref(codes.data(), levels, D, ref.data());
    ASSERT_EQ(got, ref) << "D=" << D;
    // and the layout itself: element i from bits 2 (i % 4) of byte i / 4
    for (int64_t i = 0; i < D; ++i) ASSERT_EQ(ref[i], levels[(codes[i / 4] >> (2 * (i % 4))) & 3]);
  }
}

TEST(Linalg, DecodeCodesMatchesReferenceAndThePackedLayout) {
  Rng rng(10);
  float levels[16];
  for (int k = 0; k < 16; ++k) levels[k] = static_cast<float>(k) * 0.375f - 2.0f;
  for (int bits = 1; bits <= 4; ++bits)
    for (int64_t n : {1, 7, 8, 15, 16, 17, 64, 96, 128, 1000}) {
      std::vector<uint8_t> raw(static_cast<size_t>(n)), packed(static_cast<size_t>(core::packed_bytes(n, bits)));
      for (auto& c : raw) c = static_cast<uint8_t>(rng.below(1u << bits));
      core::pack_codes(raw.data(), n, bits, packed.data());
      std::vector<float> got(static_cast<size_t>(n)), ref(got.size());
      decode_codes(packed.data(), bits, levels, n, got.data());
      decode_codes_ref(packed.data(), bits, levels, n, ref.data());
      ASSERT_EQ(got, ref) << bits << " bits, n=" << n;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ref[i], levels[raw[i]]) << bits << " bits, i=" << i;
    }
}

TEST(Linalg, DecodeAffineMatchesReferenceAndTheAffineFormula) {
  Rng rng(11);
  struct Case {
    int bits;
    int64_t D, cg;
  };
  // One pair per row (cg >= D), whole vectors, a short last group, groups shorter than a vector.
  for (const Case& c : {Case{2, 128, 128}, Case{2, 128, 32}, Case{4, 128, 64}, Case{2, 80, 64}, Case{4, 64, 8},
                        Case{1, 64, 16}, Case{8, 64, 64}, Case{8, 40, 16}})
    for (int64_t rows : {1, 3, 32}) {
      const int64_t n = rows * c.D, groups = (c.D + c.cg - 1) / c.cg;
      std::vector<uint8_t> raw(static_cast<size_t>(n)), packed(static_cast<size_t>(core::packed_bytes(n, c.bits)));
      for (auto& x : raw) x = static_cast<uint8_t>(rng.below(1u << c.bits));
      core::pack_codes(raw.data(), n, c.bits, packed.data());
      std::vector<float> pairs(static_cast<size_t>(rows * groups * 2));
      for (auto& p : pairs) p = static_cast<float>(rng.uniform() * 2 - 1);
      std::vector<float> got(static_cast<size_t>(n)), ref(got.size());
      decode_affine(packed.data(), c.bits, pairs.data(), rows, c.D, c.cg, got.data());
      decode_affine_ref(packed.data(), c.bits, pairs.data(), rows, c.D, c.cg, ref.data());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = i / c.D, d = i % c.D;
        const float* p = &pairs[static_cast<size_t>((r * groups + d / c.cg) * 2)];
        ASSERT_EQ(ref[i], std::fma(static_cast<float>(raw[i]), p[0], p[1])) << c.bits << " bits, i=" << i;
        ASSERT_NEAR(got[i], ref[i], 1e-6f) << c.bits << " bits, D=" << c.D << " cg=" << c.cg << " i=" << i;
      }
    }
}

TEST(Linalg, AbsCosineNearMaxMatchesReferenceIncludingTies) {
  Rng rng(12);
  auto cosine = [](float dot, float norm) { return std::fabs(dot) / (1.5f * norm + 1e-12f); };
  for (int64_t k : {1, 2, 15, 16, 17, 64, 257}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> dots(static_cast<size_t>(k)), norms(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) {
        dots[j] = static_cast<float>(rng.uniform() * 2 - 1);
        norms[j] = static_cast<float>(rng.uniform() + 0.1);
      }
      if (trial % 3 == 0 && k > 3) {  // exact ties: the first index wins in both
        dots[k - 1] = dots[1];
        norms[k - 1] = norms[1];
        dots[0] = 0;
      }
      for (float tol : {0.0f, 1e-3f, 0.2f}) {
        int64_t first = -1, first_ref = -1;
        const int64_t n = abs_cosine_near_max(dots.data(), k, 1.5f, norms.data(), 1e-12f, tol, &first);
        const int64_t n_ref = abs_cosine_near_max_ref(dots.data(), k, 1.5f, norms.data(), 1e-12f, tol, &first_ref);
        ASSERT_EQ(n, n_ref) << "k=" << k << " trial " << trial << " tol " << tol;
        ASSERT_EQ(first, first_ref) << "k=" << k << " trial " << trial << " tol " << tol;
        // the count and the first index are what they say
        float mx = -1.0f;
        for (int64_t j = 0; j < k; ++j) mx = std::max(mx, cosine(dots[j], norms[j]));
        int64_t count = 0, first_near = -1;
        for (int64_t j = 0; j < k; ++j)
          if (cosine(dots[j], norms[j]) >= mx - tol) count += 1, first_near = first_near < 0 ? j : first_near;
        ASSERT_EQ(n, count);
        ASSERT_EQ(first, first_near);
      }
    }
  }
  const float zero_dots[3] = {0, 0, 0}, norms[3] = {0, 0, 0};
  int64_t first = -1;
  EXPECT_EQ(abs_cosine_near_max(zero_dots, 3, 0.0f, norms, 1e-12f, 0.0f, &first), 3);
  EXPECT_EQ(first, 0);
}

TEST(Linalg, MatmulNNMatchesReferenceOverSizesAndStrides) {
  // Row counts around the 4-row panels, column counts around whole vectors
  // (16 lanes on AVX-512) and 4-vector panels, padded strides.
  Rng rng(41);
  for (int64_t n : {1, 3, 4, 7, 64})
    for (int64_t m : {1, 15, 16, 17, 64, 70, 128})
      for (int64_t K : {1, 5, 64, 128}) {
        const int64_t lda = K + 3, ldb = m + 5, ldc = m + 2;
        const auto A = random_vec(rng, static_cast<size_t>(n * lda)), B = random_vec(rng, static_cast<size_t>(K * ldb));
        std::vector<float> C(static_cast<size_t>(n * ldc), -7.0f), R(C.size(), -7.0f);
        matmul_nn(A.data(), n, lda, B.data(), ldb, K, m, C.data(), ldc);
        matmul_nn_ref(A.data(), n, lda, B.data(), ldb, K, m, R.data(), ldc);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const size_t at = static_cast<size_t>(i * ldc + j);
            if (j >= m) {  // past the columns: untouched
              ASSERT_EQ(C[at], -7.0f);
              continue;
            }
            double mag = 0;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(double(A[i * lda + k]) * B[k * ldb + j]);
            ASSERT_NEAR(C[at], R[at], kSimdRelTol * mag + 1e-30) << n << "x" << m << "x" << K << " at " << i << "," << j;
          }
      }
}

TEST(Linalg, SwigluMatchesReference) {
  Rng rng(43);
  for (int64_t n : {1, 15, 16, 33, 1000}) {
    std::vector<float> gate = random_vec(rng, static_cast<size_t>(n)), up = random_vec(rng, static_cast<size_t>(n));
    for (auto& g : gate) g *= 12.0f;
    if (n > 3) gate[0] = -200.0f, gate[1] = 200.0f, gate[2] = 0.0f, gate[3] = -88.5f;  // past exp's range; zero
    std::vector<float> fast = gate, ref = gate;
    swiglu(fast.data(), up.data(), n);
    swiglu_ref(ref.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(fast[i], ref[i], 4e-6 * std::fabs(ref[i]) + 1e-30) << "n " << n << " at " << i << " gate " << gate[i];
  }
}

}  // namespace
}  // namespace anchorkv::core
