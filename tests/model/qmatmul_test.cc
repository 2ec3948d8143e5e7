// The integer matmul (8-bit activations) against its scalar twin and against
// exact arithmetic on the dequantized weights, for every weight type it takes.
#include "model/qmatmul.h"

#include "model/amx_matmul.h"
#include "model/matmul_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "anchorkv/status.h"
#include "core/half.h"
#include "hwy/targets.h"
#include "io/gguf.h"

namespace anchorkv::model {
namespace {

// Random blocks with sane fp16 scales: every other bit pattern of these
// block types is a valid block.
std::vector<uint8_t> random_blocks(io::GgmlType type, int64_t rows, int64_t cols, std::mt19937& g) {
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols / be * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<uint8_t>(byte(g));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  auto half_at = [&](size_t at, float v) {
    const uint16_t h = core::float_to_half(v);
    std::memcpy(&bytes[at], &h, 2);
  };
  for (size_t b = 0; b < bytes.size(); b += static_cast<size_t>(bb)) {
    if (type == io::GgmlType::kQ6_K) {
      half_at(b + 208, scale(g));
    } else {
      half_at(b, scale(g));
      if (type == io::GgmlType::kQ4_K || type == io::GgmlType::kQ5_K) half_at(b + 2, std::fabs(scale(g)));
    }
  }
  return bytes;
}

std::vector<float> random_activations(int64_t T, int64_t cols, std::mt19937& g) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * cols));
  for (auto& v : x) v = n(g);
  // a group of zeros and one outlier: the scale's edge cases
  for (int64_t i = 0; i < std::min<int64_t>(cols, 32); ++i) x[static_cast<size_t>(i)] = 0.0f;
  if (T > 1) x[static_cast<size_t>(cols + 5)] = 40.0f;
  return x;
}

// Each of `outs` [T, rows] within float rounding of `ref` (the twin): 1e-5
// of sum |w x| of its row and token, w the GGUF rows `blocks` dequantized.
void expect_near_ref(io::GgmlType type, const uint8_t* blocks, int64_t rows, int64_t cols, const std::vector<float>& x,
                     int64_t T, const std::vector<float>& ref, std::initializer_list<const std::vector<float>*> outs,
                     const std::string& what) {
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  std::vector<float> w(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    io::dequantize_row_ref(type, blocks + r * (cols / be * bb), cols, w.data());
    for (int64_t t = 0; t < T; ++t) {
      double magnitude = 0;
      for (int64_t i = 0; i < cols; ++i) magnitude += std::fabs(double(w[i]) * x[t * cols + i]);
      const size_t at = static_cast<size_t>(t * rows + r);
      int k = 0;
      for (const std::vector<float>* y : outs)
        ASSERT_NEAR((*y)[at], ref[at], 1e-5 * magnitude + 1e-30)
            << what << " output " << k++ << " T " << T << " t " << t << " row " << r;
    }
  }
}

// The kernel choice: what is asked for, limited to what the CPU runs; the
// previous choice comes back so a caller can restore it.
TEST(MatmulKernels, UseIsLimitedToTheCpuAndReturnsThePrevious) {
  const MatmulKernels cpu = cpu_matmul_kernels(), before = matmul_kernels();
  const MatmulKernels previous =
      use_matmul_kernels({.byte_rows = true, .vnni_rows = true, .amx = true, .dot_rows = true, .mmla_rows = true});
  EXPECT_EQ(previous.byte_rows, before.byte_rows);
  EXPECT_EQ(previous.amx, before.amx);
  EXPECT_EQ(previous.dot_rows, before.dot_rows);
  MatmulKernels now = matmul_kernels();
  EXPECT_EQ(now.byte_rows, cpu.byte_rows);
  EXPECT_EQ(now.vnni_rows, cpu.vnni_rows);
  EXPECT_EQ(now.amx, cpu.amx);
  EXPECT_EQ(now.dot_rows, cpu.dot_rows);
  EXPECT_EQ(now.mmla_rows, cpu.mmla_rows);
  use_matmul_kernels({.byte_rows = false, .vnni_rows = true, .amx = false, .dot_rows = true, .mmla_rows = false});
  now = matmul_kernels();
  EXPECT_FALSE(now.byte_rows);
  EXPECT_EQ(now.vnni_rows, cpu.vnni_rows);
  EXPECT_FALSE(now.amx);
  EXPECT_EQ(now.dot_rows, cpu.dot_rows);
  EXPECT_FALSE(now.mmla_rows);
  EXPECT_FALSE(amx_matmul_usable(io::GgmlType::kQ8_0)) << "switched-off tiles are not usable";
  use_matmul_kernels(before);
  EXPECT_EQ(matmul_kernels().amx, before.amx);
}

TEST(Int8Activations, SimdQuantizationIsBitIdenticalToTheScalarTwin) {
  std::mt19937 g(3);
  for (int64_t group : {32, 256}) {
    const int64_t T = 7, cols = 768;
    std::vector<float> x = random_activations(T, cols, g);
    x[static_cast<size_t>(3 * cols + 300)] = NAN;  // poisons its group's scale
    Int8Activations fast, ref;
    quantize_int8(x.data(), T, cols, group, &fast, 2);
    quantize_int8_ref(x.data(), T, cols, group, &ref);
    ASSERT_EQ(fast.q, ref.q);
    ASSERT_EQ(fast.sum, ref.sum);
    ASSERT_EQ(fast.scale.size(), ref.scale.size());
    for (size_t i = 0; i < ref.scale.size(); ++i) {
      if (std::isnan(ref.scale[i])) {
        EXPECT_TRUE(std::isnan(fast.scale[i])) << i;
      } else {
        EXPECT_EQ(fast.scale[i], ref.scale[i]) << i;
      }
    }
    EXPECT_TRUE(std::isnan(ref.scale[static_cast<size_t>((3 * cols + 300) / group)]));
    for (int16_t q : ref.q) ASSERT_LE(std::abs(q), 127);
    // every element is within half a step of its value
    for (int64_t i = 0; i < T * cols; ++i) {
      const float s = ref.scale[static_cast<size_t>(i / group)];
      if (std::isnan(s)) continue;
      ASSERT_LE(std::fabs(x[static_cast<size_t>(i)] - s * ref.q[static_cast<size_t>(i)]), 0.5f * s * 1.0001f)
          << i;
    }
  }
}

class Int8Matmul : public ::testing::TestWithParam<io::GgmlType> {};

TEST_P(Int8Matmul, AgreesWithTheScalarTwinAndTheActivationErrorBound) {
  const io::GgmlType type = GetParam();
  std::mt19937 g(11);
  const int64_t rows = 37, cols = 512;  // rows: not a multiple of a task's 16
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
  const QuantMatrix W{type, blocks.data(), rows, cols, cols / be * bb};
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    io::dequantize_row_ref(type, blocks.data() + r * W.row_bytes, cols, &w[static_cast<size_t>(r * cols)]);
  for (int64_t T : {1, 3, 4, 9}) {  // token blocks of 4 and what is left over
    const std::vector<float> x = random_activations(T, cols, g);
    std::vector<float> y1(static_cast<size_t>(T * rows)), y2(y1.size()), yr(y1.size());
    matmul_int8(x.data(), T, W, y1.data(), 1);
    matmul_int8(x.data(), T, W, y2.data(), 2);
    matmul_int8_ref(x.data(), T, W, yr.data());
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "thread count changed the bits";
    Int8Activations a;
    quantize_int8_ref(x.data(), T, cols, int8_group(type), &a);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0.0, magnitude = 0.0, bound = 0.0;
        for (int64_t i = 0; i < cols; ++i) {
          const double wi = w[static_cast<size_t>(r * cols + i)], xi = x[static_cast<size_t>(t * cols + i)];
          exact += wi * xi;
          magnitude += std::fabs(wi * xi);
          bound += std::fabs(wi) * 0.5 * a.scale[static_cast<size_t>((t * cols + i) / a.group)];
        }
        const size_t at = static_cast<size_t>(t * rows + r);
        // fast vs twin: float rounding of scales and lane sums only
        ASSERT_NEAR(y1[at], yr[at], 1e-5 * magnitude + 1e-30) << "t " << t << " row " << r;
        // twin vs f32 activations: at most half an activation step per element
        ASSERT_LE(std::fabs(yr[at] - exact), bound * 1.0001 + 1e-6 * magnitude) << "t " << t << " row " << r;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Int8Matmul,
                         ::testing::Values(io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K,
                                           io::GgmlType::kQ5_K, io::GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(io::ggml_type_name(info.param)); });

// The byte kernels (AVX-512BW: Q4_K, Q6_K; with VNNI: Q8_0, Q4_0) and the 16-bit kernels: the same
// integer sums, so outputs agree to the float rounding of the flush; both
// agree with the twin (one and four rows per pass, token blocks and single
// tokens); the int8 copy of the activations matches the int16 one.
class ByteKernel : public ::testing::TestWithParam<io::GgmlType> {};

TEST_P(ByteKernel, MatchesThe16BitKernelAndTheTwin) {
  if (!cpu_matmul_kernels().byte_rows) GTEST_SKIP() << "this CPU has no AVX-512BW";
  const io::GgmlType type = GetParam();
  std::mt19937 g(5);
  const int64_t rows = 21, cols = 1024;
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
  const QuantMatrix W{type, blocks.data(), rows, cols, cols / be * bb};
  for (int64_t T : {1, 2, 4, 6}) {
    const std::vector<float> x = random_activations(T, cols, g);
    std::vector<float> bytes(static_cast<size_t>(T * rows)), words(bytes.size()), ref(bytes.size());
    const MatmulKernels all = matmul_kernels();
    matmul_int8(x.data(), T, W, bytes.data(), 2);
    use_matmul_kernels({.byte_rows = false, .vnni_rows = false, .amx = all.amx});
    matmul_int8(x.data(), T, W, words.data(), 2);
    use_matmul_kernels(all);
    matmul_int8_ref(x.data(), T, W, ref.data());
    float scale = 0.0f;
    for (float v : ref) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < bytes.size(); ++i) {
      ASSERT_NEAR(bytes[i], words[i], 1e-5f * scale) << "T " << T << " at " << i;
      ASSERT_NEAR(bytes[i], ref[i], 1e-5f * scale) << "T " << T << " at " << i;
    }
    Int8Activations a;
    quantize_int8(x.data(), T, cols, 256, &a, 1);
    for (size_t i = 0; i < a.q.size(); ++i) ASSERT_EQ(a.q8[i], a.q[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ByteKernel, ::testing::Values(io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K, io::GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(io::ggml_type_name(info.param)); });

// The AArch64 kernels (SDOT rows, SMMLA tiles of two rows and two tokens)
// against the Highway kernels and the twin. A token's arithmetic is the
// same in a tile and alone, so SMMLA on or off and the thread count leave
// the bits as they are.
class ArmKernel : public ::testing::TestWithParam<io::GgmlType> {};

TEST_P(ArmKernel, MatchesTheHighwayKernelAndTheTwinWithTheSameBitsInTilesAndAlone) {
  const MatmulKernels cpu = cpu_matmul_kernels();
  if (!cpu.dot_rows) GTEST_SKIP() << "this CPU has no AArch64 dot-product instruction";
  const io::GgmlType type = GetParam();
  std::mt19937 g(23);
  const int64_t rows = 21, cols = 1024;
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
  const QuantMatrix W{type, blocks.data(), rows, cols, cols / be * bb};
  const MatmulKernels all = matmul_kernels();
  for (int64_t T : {1, 2, 3, 5}) {
    const std::vector<float> x = random_activations(T, cols, g);
    std::vector<float> tiles(static_cast<size_t>(T * rows)), alone(tiles.size()), one_thread(tiles.size()),
        highway(tiles.size()), ref(tiles.size());
    matmul_int8(x.data(), T, W, tiles.data(), 2);
    matmul_int8(x.data(), T, W, one_thread.data(), 1);
    use_matmul_kernels({.dot_rows = true});
    matmul_int8(x.data(), T, W, alone.data(), 2);
    use_matmul_kernels({});
    matmul_int8(x.data(), T, W, highway.data(), 2);
    use_matmul_kernels(all);
    matmul_int8_ref(x.data(), T, W, ref.data());
    EXPECT_EQ(tiles, alone) << "T " << T;
    EXPECT_EQ(tiles, one_thread) << "T " << T;
    expect_near_ref(type, blocks.data(), rows, cols, x, T, ref, {&tiles, &highway}, "arm");
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ArmKernel, ::testing::Values(io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K),
                         [](const auto& info) { return std::string(io::ggml_type_name(info.param)); });

TEST(Int8Matmul, EverySimdTargetAgreesWithTheTwin) {
  // The dispatcher picks the best target of this CPU; force each one it has
  // (AVX-512, AVX2, SSE4, ...: other vector widths take other loop shapes).
  std::mt19937 g(17);
  const int64_t rows = 9, cols = 512, T = 5;
  const std::vector<float> x = random_activations(T, cols, g);
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (io::GgmlType type : {io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K,
                              io::GgmlType::kQ5_K, io::GgmlType::kQ6_K}) {
      int64_t be = 0, bb = 0;
      io::ggml_block(type, &be, &bb);
      const std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
      const QuantMatrix W{type, blocks.data(), rows, cols, cols / be * bb};
      std::vector<float> y(static_cast<size_t>(T * rows)), yr(y.size()), w(static_cast<size_t>(cols));
      matmul_int8(x.data(), T, W, y.data(), 2);
      matmul_int8_ref(x.data(), T, W, yr.data());
      Int8Activations fast, ref;
      quantize_int8(x.data(), T, cols, int8_group(type), &fast, 1);
      quantize_int8_ref(x.data(), T, cols, int8_group(type), &ref);
      EXPECT_EQ(fast.q, ref.q) << hwy::TargetName(target);
      for (int64_t r = 0; r < rows; ++r) {
        io::dequantize_row_ref(type, blocks.data() + r * W.row_bytes, cols, w.data());
        for (int64_t t = 0; t < T; ++t) {
          double magnitude = 0;
          for (int64_t i = 0; i < cols; ++i) magnitude += std::fabs(double(w[i]) * x[t * cols + i]);
          ASSERT_NEAR(y[t * rows + r], yr[t * rows + r], 1e-5 * magnitude + 1e-30)
              << hwy::TargetName(target) << " " << io::ggml_type_name(type) << " row " << r << " t " << t;
        }
      }
    }
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

// Matrices of several types sharing their input width, for batch tests.
struct Batch {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<QuantMatrix> W;
};

Batch random_batch(const std::vector<io::GgmlType>& types, const std::vector<int64_t>& rows, int64_t cols,
                   unsigned seed) {
  std::mt19937 g(seed);
  Batch b;
  b.blocks.reserve(types.size());
  for (size_t m = 0; m < types.size(); ++m) {
    int64_t be = 0, bb = 0;
    io::ggml_block(types[m], &be, &bb);
    b.blocks.push_back(random_blocks(types[m], rows[m], cols, g));
    b.W.push_back({types[m], b.blocks.back().data(), rows[m], cols, cols / be * bb});
  }
  return b;
}

// One batch call gives, for every thread count, the bits of separate calls.
void expect_batch_is_separate_calls(const Batch& b, int64_t T, const std::vector<int>& thread_counts) {
  std::mt19937 g(T);
  const std::vector<float> x = random_activations(T, b.W[0].cols, g);
  const int n = static_cast<int>(b.W.size());
  for (int threads : thread_counts) {
    std::vector<std::vector<float>> batch(n), alone(n);
    std::vector<float*> ys;
    for (int m = 0; m < n; ++m) {
      batch[m].assign(static_cast<size_t>(T * b.W[m].rows), -1.0f);
      alone[m].resize(batch[m].size());
      ys.push_back(batch[m].data());
      matmul_int8(x.data(), T, b.W[m], alone[m].data(), 1);
    }
    matmul_int8_batch(x.data(), T, b.W.data(), ys.data(), n, threads);
    for (int m = 0; m < n; ++m)
      ASSERT_EQ(0, std::memcmp(batch[m].data(), alone[m].data(), batch[m].size() * 4)) << m << " " << threads;
  }
}

// The AMX tiles (prefill, from kAmxMinTokens tokens) and the row kernels:
// the same integer sums per block, so outputs agree to float rounding; both
// agree with the twin; one, two and three threads give the same bits; rows
// past the last whole group of 16 and tokens past the last whole tile of 16
// are covered.
class AmxTiles : public ::testing::TestWithParam<io::GgmlType> {};

TEST_P(AmxTiles, MatchTheRowKernelsAndTheTwin) {
  if (!cpu_matmul_kernels().amx) GTEST_SKIP() << "this CPU or kernel gives no AMX tiles";
  const io::GgmlType type = GetParam();
  ASSERT_TRUE(amx_matmul_usable(type));
  std::mt19937 g(23);
  const int64_t rows = 16 * 3 + 5, cols = 768;
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
  const QuantMatrix W{type, blocks.data(), rows, cols, cols / be * bb};
  for (int64_t T : {kAmxMinTokens, int64_t{16}, int64_t{23}, int64_t{40}}) {
    const std::vector<float> x = random_activations(T, cols, g);
    std::vector<float> tiles(static_cast<size_t>(T * rows)), rows_kernel(tiles.size()), ref(tiles.size());
    matmul_int8(x.data(), T, W, tiles.data(), 2);
    for (int threads : {1, 3}) {
      std::vector<float> again(tiles.size());
      matmul_int8(x.data(), T, W, again.data(), threads);
      ASSERT_EQ(0, std::memcmp(again.data(), tiles.data(), tiles.size() * 4)) << "threads " << threads;
    }
    MatmulKernels rows_only = matmul_kernels();
    rows_only.amx = false;
    const MatmulKernels all = use_matmul_kernels(rows_only);
    matmul_int8(x.data(), T, W, rows_kernel.data(), 2);
    use_matmul_kernels(all);
    matmul_int8_ref(x.data(), T, W, ref.data());
    expect_near_ref(type, blocks.data(), rows, cols, x, T, ref, {&tiles, &rows_kernel}, "tiles, rows");
  }
}

TEST(AmxTiles, ABatchOfMixedTypesGivesTheBitsOfSeparateCalls) {
  if (!cpu_matmul_kernels().amx) GTEST_SKIP() << "this CPU or kernel gives no AMX tiles";
  const Batch b = random_batch({io::GgmlType::kQ8_0, io::GgmlType::kQ4_K, io::GgmlType::kQ6_K, io::GgmlType::kQ4_0},
                               {48, 35, 21, 16}, 512, 29);
  expect_batch_is_separate_calls(b, 21, {2});
  std::vector<float> y(16 * 48);
  EXPECT_THROW(rows_amx(b.W[0], 0, 8, AmxTokens{}, y.data()), Error);  // not a whole group of 16
}

INSTANTIATE_TEST_SUITE_P(Types, AmxTiles,
                         ::testing::Values(io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K,
                                           io::GgmlType::kQ5_K, io::GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(io::ggml_type_name(info.param)); });

// Q8_0, Q4_0, Q4_K and Q5_K rearranged into groups of 16 rows (kRows16): a lossless
// round trip; products on it (one-token VNNI rows, token blocks, AMX tiles
// from kAmxMinTokens) agree with the GGUF layout's kernels and the twin, and
// one, two and three threads give the same bits, with a partial last group.
class Rows16 : public ::testing::TestWithParam<io::GgmlType> {};

TEST_P(Rows16, RoundTripsAndMatchesTheGgufLayoutAndTheTwin) {
  const io::GgmlType type = GetParam();
  if (!rows16_supported(type)) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 g(31);
  const int64_t rows = 16 * 3 + 5, cols = 768;
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const int64_t row_bytes = cols / be * bb;
  std::vector<uint8_t> blocks = random_blocks(type, rows, cols, g);
  if (type == io::GgmlType::kQ8_0) blocks[2] = 0x80;  // -128: never written by a quantizer, still valid
  std::vector<uint8_t> packed(static_cast<size_t>(rows16_bytes(type, rows, cols)));
  pack_rows16(type, blocks.data(), rows, cols, packed.data());
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
  std::vector<float> w(static_cast<size_t>(cols)), wp(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    unpack_rows16_row(type, packed.data(), cols, r, row.data());
    ASSERT_EQ(0, std::memcmp(row.data(), blocks.data() + r * row_bytes, static_cast<size_t>(row_bytes))) << r;
    io::dequantize_row_ref(type, row.data(), cols, w.data());
    dequantize_rows16_row(type, packed.data(), cols, r, wp.data());
    ASSERT_EQ(w, wp) << r;
  }
  const QuantMatrix gguf{type, blocks.data(), rows, cols, row_bytes};
  const QuantMatrix W{type, packed.data(), rows, cols, row_bytes, QuantLayout::kRows16};
  for (int64_t T : {1, 2, 3, 4, 5, 6, 16, 23}) {
    const std::vector<float> x = random_activations(T, cols, g);
    std::vector<float> y(static_cast<size_t>(T * rows)), rows_kernel(y.size()), in_place(y.size()), ref(y.size());
    matmul_int8(x.data(), T, W, y.data(), 2);
    for (int threads : {1, 3}) {
      std::vector<float> again(y.size());
      matmul_int8(x.data(), T, W, again.data(), threads);
      ASSERT_EQ(0, std::memcmp(again.data(), y.data(), y.size() * 4)) << "T " << T << " threads " << threads;
    }
    MatmulKernels rows_only = matmul_kernels();
    rows_only.amx = false;
    const MatmulKernels all = use_matmul_kernels(rows_only);
    matmul_int8(x.data(), T, W, rows_kernel.data(), 2);
    use_matmul_kernels(all);
    matmul_int8(x.data(), T, gguf, in_place.data(), 2);
    matmul_int8_ref(x.data(), T, W, ref.data());
    std::vector<float> ref_gguf(y.size());
    matmul_int8_ref(x.data(), T, gguf, ref_gguf.data());
    ASSERT_EQ(ref, ref_gguf) << "the twin reads both layouts as the same matrix";
    expect_near_ref(type, blocks.data(), rows, cols, x, T, ref, {&y, &rows_kernel, &in_place},
                    "rows16 (tiles where T >= 6), rows16 rows, in place");
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Rows16,
                         ::testing::Values(io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K, io::GgmlType::kQ5_K),
                         [](const auto& info) { return std::string(io::ggml_type_name(info.param)); });

TEST(Rows16, ABatchWithOtherTypesGivesTheBitsOfSeparateCalls) {
  if (!rows16_supported(io::GgmlType::kQ8_0)) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  Batch b = random_batch({io::GgmlType::kQ8_0, io::GgmlType::kQ6_K, io::GgmlType::kQ4_K, io::GgmlType::kQ4_0,
                          io::GgmlType::kQ5_K},
                         {37, 20, 35, 48, 17}, 512, 41);
  for (int m : {0, 2, 3, 4}) {  // Q8_0, Q4_K, Q4_0 and Q5_K rearranged, Q6_K in place
    std::vector<uint8_t> packed(static_cast<size_t>(rows16_bytes(b.W[m].type, b.W[m].rows, 512)));
    pack_rows16(b.W[m].type, b.blocks[m].data(), b.W[m].rows, 512, packed.data());
    b.blocks[m] = std::move(packed);
    b.W[m].blocks = b.blocks[m].data();
    b.W[m].layout = QuantLayout::kRows16;
  }
  expect_batch_is_separate_calls(b, 1, {1, 2, 3});
  expect_batch_is_separate_calls(b, 3, {1, 2});
  expect_batch_is_separate_calls(b, 21, {2});
  QuantMatrix wrong = b.W[1];
  wrong.layout = QuantLayout::kRows16;  // no Q6_K kernel reads groups of 16 rows
  std::vector<float> x(512, 1.0f), y(20);
  EXPECT_THROW(matmul_int8(x.data(), 1, wrong, y.data(), 1), Error);
}

TEST(Int8Matmul, ABatchGivesTheBitsOfSeparateCalls) {
  // Mixed group sizes (32 and 256) and row counts that split unevenly between threads.
  const Batch b = random_batch({io::GgmlType::kQ8_0, io::GgmlType::kQ4_K, io::GgmlType::kQ6_K}, {37, 20, 5}, 512, 5);
  expect_batch_is_separate_calls(b, 3, {1, 2, 3});
  const std::vector<QuantMatrix>& W = b.W;
  const std::vector<float> x(512, 1.0f);
  std::vector<float> y(64);
  QuantMatrix narrow = W[0];
  narrow.cols = 256;
  narrow.row_bytes = 256 / 32 * 34;
  const QuantMatrix mixed[] = {W[0], narrow};
  float* outs[] = {y.data(), y.data()};
  EXPECT_THROW(matmul_int8_batch(x.data(), 1, mixed, outs, 2, 1), Error);
}

TEST(Int8Matmul, OtherTypesAndBadShapesAreClearErrors) {
  std::vector<uint8_t> blocks(64, 0);
  std::vector<float> x(32, 1.0f), y(1);
  try {
    matmul_int8(x.data(), 1, QuantMatrix{io::GgmlType::kQ2_K, blocks.data(), 1, 256, 84}, y.data(), 1);
    FAIL() << "Q2_K has no integer kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  try {
    matmul_int8(x.data(), 1, QuantMatrix{io::GgmlType::kQ8_0, blocks.data(), 1, 32, 30}, y.data(), 1);
    FAIL() << "row bytes do not match Q8_0";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace anchorkv::model
