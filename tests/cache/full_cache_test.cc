#include <gtest/gtest.h>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"
#include "cache/input.h"

namespace anchorkv {
namespace {

TEST(FullKVCache, StoresExactFp16AndAccumulates) {
  FullKVCache c;
  const std::vector<float> k = {1.0f, 2.0f, 3.0f, 1.0f / 3, 5, 6, 7, 8};  // [1, 2, 2, 2]
  const std::vector<float> v = {-1, -2, -3, -4, -5, -6, -7, -8};
  auto out =
      c.update_and_fetch(TensorView::f32(k.data(), {1, 2, 2, 2}), TensorView::f32(v.data(), {1, 2, 2, 2}));
  EXPECT_EQ(out.keys.shape(), (Shape4{1, 2, 2, 2}));
  EXPECT_EQ(out.keys.dtype(), DType::kF16);
  EXPECT_EQ(out.keys.at(0, 0, 1, 1), fp16_to_f32(f32_to_fp16(1.0f / 3)));
  EXPECT_EQ(out.values.at(0, 1, 1, 1), -8.0f);
  const std::vector<float> k1 = {9, 10, 11, 12}, v1 = {0, 0, 0, 0};
  out =
      c.update_and_fetch(TensorView::f32(k1.data(), {1, 2, 1, 2}), TensorView::f32(v1.data(), {1, 2, 1, 2}));
  EXPECT_EQ(out.keys.shape(), (Shape4{1, 2, 3, 2}));
  EXPECT_EQ(out.keys.at(0, 0, 2, 0), 9.0f);
  EXPECT_EQ(out.keys.at(0, 1, 0, 0), 5.0f);
  EXPECT_EQ(out.keys.at(0, 1, 2, 1), 12.0f);
  EXPECT_EQ(c.offset(), 3);
  EXPECT_EQ(c.nbytes(), 3 * 2 * 2 * 4);
  EXPECT_EQ(c.tokens_total(), 6);
  EXPECT_DOUBLE_EQ(c.compression_ratio(), 1.0);
  c.trim(1);
  EXPECT_EQ(c.offset(), 2);
  EXPECT_EQ(c.fetch().keys.at(0, 1, 1, 1), 8.0f);
  EXPECT_THROW(c.trim(5), Error);
}

}  // namespace
}  // namespace anchorkv

namespace anchorkv {
namespace {
// Decode appends one token at a time: the rows' storage must grow
// geometrically (an exact reserve per append copied every row on every step,
// quadratic in the context).
TEST(ExactRows, OneTokenAppendsReallocateLogarithmicallyOften) {
  const int64_t D = 8;
  std::vector<float> x(static_cast<size_t>(2 * D), 0.5f);
  cache::ExactRows rows;
  int reallocations = 0;
  const uint16_t* last = nullptr;
  for (int i = 0; i < 4096; ++i) {
    const TensorView t = TensorView::f32(x.data(), {1, 2, 1, D});
    rows.append(cache::stage_input("test", t, t, false, 0, 0, 0));
    if (rows.k[1].data() != last) ++reallocations, last = rows.k[1].data();
  }
  EXPECT_EQ(rows.tokens, 4096);
  EXPECT_EQ(rows.k[1].size(), static_cast<size_t>(4096 * D));
  EXPECT_LE(reallocations, 20);
}

// A prompt leaves room for the decode steps after it: the first of them
// appends in place instead of copying every row (the full cache's first
// decode step after a long prompt).
TEST(ExactRows, DecodeStepsAfterAPromptAppendInPlace) {
  const int64_t D = 8, S = 20000;
  std::vector<float> prompt(static_cast<size_t>(2 * S * D), 0.25f), x(static_cast<size_t>(2 * D), 0.5f);
  cache::ExactRows rows;
  const TensorView p = TensorView::f32(prompt.data(), {1, 2, S, D});
  rows.append(cache::stage_input("test", p, p, false, 0, 0, 0));
  const uint16_t* k = rows.k[1].data();
  for (int i = 0; i < S / 16; ++i) {  // well within the eighth reserved
    const TensorView t = TensorView::f32(x.data(), {1, 2, 1, D});
    rows.append(cache::stage_input("test", t, t, false, 0, 0, 0));
  }
  EXPECT_EQ(rows.k[1].data(), k) << "a decode step after the prompt reallocated the rows";
  EXPECT_EQ(rows.tokens, S + S / 16);
}
}  // namespace
}  // namespace anchorkv
