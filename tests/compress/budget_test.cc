#include "compress/budget.h"

#include <gtest/gtest.h>

#include <cmath>

namespace anchorkv::compress {
namespace {

TEST(Budget, ByteFormulas) {
  EXPECT_EQ(residual_bytes(128, 2), 34);
  EXPECT_EQ(residual_bytes(64, 2), 18);
  EXPECT_EQ(residual_bytes(17, 3), 9);  // ceil(51 / 8) = 7, + 2
  EXPECT_EQ(residual_bytes(128, 1), 18);
  EXPECT_EQ(full_row_bytes(4096, 128), 2097152);
  EXPECT_EQ(base_row_bytes(4096, 32, 128), 32 * 512 + 4064 * 16);
}

TEST(Budget, EquationNineByHand) {
  // theta = 0.05, S = 4096, D = 128, 32 anchors:
  // (0.05 * 2097152 - 81408) / 34 = 689.69 -> 689.
  EXPECT_EQ(residual_budget(0.05, 2097152, 81408, 34), 689);
  EXPECT_EQ(residual_budget(0.0, 2097152, 81408, 34), 0);   // never negative
  EXPECT_EQ(residual_budget(0.02, 2097152, 81408, 34), 0);  // base above theta * full
  EXPECT_EQ(split_budget(689).keys, 344);
  EXPECT_EQ(split_budget(689).values, 345);
  EXPECT_EQ(split_budget(0).keys, 0);
}

TEST(Budget, AllocateTopPoolsRowsWithDeterministicTies) {
  const float inf = INFINITY;
  const std::vector<float> r0 = {5, -inf, 1, 3, 3};
  const std::vector<float> r1 = {3, 4, -inf, NAN, 0};
  const std::vector<std::span<const float>> rows = {r0, r1};
  auto c = allocate_top(rows, 3);  // 5 (r0,0), 4 (r1,1), then 3: tie r0,3 wins (lower row, position)
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{1}));
  c = allocate_top(rows, 4);
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{1}));
  c = allocate_top(rows, 100);  // capped: anchors (-inf) and NaN never chosen
  EXPECT_EQ(c[0], (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{0, 1, 4}));
  c = allocate_top(rows, 0);
  EXPECT_TRUE(c[0].empty() && c[1].empty());
}

}  // namespace
}  // namespace anchorkv::compress
