// Each kind of bad input gets a clear error naming the operation, and the cache
// is exactly as it was afterwards.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"

namespace anchorkv {
namespace {

using testing_util::bits_of;
using testing_util::random_kv;

struct Snapshot {
  int64_t offset, bytes, full, tokens, anchors, residuals;
  std::vector<uint16_t> k, v;
  bool operator==(const Snapshot&) const = default;
};

template <class C>
Snapshot snap(const C& c) {
  const auto out = c.fetch();
  int64_t anchors = 0, residuals = 0;
  if constexpr (std::is_same_v<C, AnchorKVCache>) {
    anchors = c.n_anchor_total();
    residuals = c.n_residual_total();
  }
  return {c.offset(), c.nbytes(), c.full_seq_bytes(), c.tokens_total(), anchors, residuals,
          bits_of(out.keys), bits_of(out.values)};
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    K = random_kv(1, 2, 64, 16, 1);
    V = random_kv(1, 2, 64, 16, 2);
    cache.update_and_fetch(view(K, 64), view(V, 64));
    full.update_and_fetch(view(K, 64), view(V, 64));
    before = snap(cache);
    full_before = snap(full);
  }
  static TensorView view(const std::vector<float>& x, int64_t S, int64_t B = 1, int64_t H = 2, int64_t D = 16) {
    return TensorView::f32(x.data(), {B, H, S, D});
  }
  // Calls update_and_fetch on both caches; expects `code` and `needle` in the message.
  void expect_rejected(const TensorView& k, const TensorView& v, ErrorCode code, const std::string& needle) {
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0)
          cache.update_and_fetch(k, v);
        else
          full.update_and_fetch(k, v);
        ADD_FAILURE() << "expected an error containing '" << needle << "'";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        const std::string msg = e.what();
        EXPECT_NE(msg.find("update_and_fetch]"), std::string::npos) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      }
    }
    EXPECT_TRUE(snap(cache) == before) << "AnchorKVCache changed by a failed call";
    EXPECT_TRUE(snap(full) == full_before) << "FullKVCache changed by a failed call";
  }
  std::vector<float> K, V;
  AnchorKVCache cache;
  FullKVCache full;
  Snapshot before, full_before;
};

TEST_F(BadInput, MismatchedKeyValueShapes) {
  const auto k = random_kv(1, 2, 3, 16, 3), v = random_kv(1, 2, 4, 16, 4);
  expect_rejected(view(k, 3), view(v, 4), ErrorCode::kShapeMismatch, "keys and values differ");
}

TEST_F(BadInput, BatchChangesBetweenCalls) {
  const auto k = random_kv(2, 2, 1, 16, 3);
  expect_rejected(view(k, 1, 2), view(k, 1, 2), ErrorCode::kShapeMismatch, "does not match");
}

TEST_F(BadInput, HeadsChangeBetweenCalls) {
  const auto k = random_kv(1, 3, 1, 16, 3);
  expect_rejected(view(k, 1, 1, 3), view(k, 1, 1, 3), ErrorCode::kShapeMismatch, "H=2");
}

TEST_F(BadInput, HeadDimChangesBetweenCalls) {
  const auto k = random_kv(1, 2, 1, 8, 3);
  expect_rejected(view(k, 1, 1, 2, 8), view(k, 1, 1, 2, 8), ErrorCode::kShapeMismatch, "D=16");
}

TEST_F(BadInput, ZeroHeadDim) {
  std::vector<float> k(4);
  expect_rejected(view(k, 1, 1, 2, 0), view(k, 1, 1, 2, 0), ErrorCode::kInvalidArgument, "D = 0");
}

TEST_F(BadInput, NaN) {
  auto k = random_kv(1, 2, 5, 16, 3);
  k[37] = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(view(k, 5), view(k, 5), ErrorCode::kNonFinite, "non-finite");
}

TEST_F(BadInput, InfInValues) {
  auto k = random_kv(1, 2, 5, 16, 3), v = k;
  v[100] = -std::numeric_limits<float>::infinity();
  expect_rejected(view(k, 5), view(v, 5), ErrorCode::kNonFinite, "values holds a non-finite");
}

TEST_F(BadInput, BeyondFp16Range) {
  auto k = random_kv(1, 2, 5, 16, 3);
  k[0] = 65505.0f;
  expect_rejected(view(k, 5), view(k, 5), ErrorCode::kOutOfRange, "beyond the fp16 range");
}

TEST_F(BadInput, NullData) {
  TensorView k{nullptr, DType::kF32, {1, 2, 3, 16}, {96, 48, 16, 1}};
  expect_rejected(k, k, ErrorCode::kInvalidArgument, "null data");
}

TEST_F(BadInput, NegativeStride) {
  auto k = random_kv(1, 2, 3, 16, 3);
  TensorView v = view(k, 3);
  v.strides[2] = -16;
  expect_rejected(v, v, ErrorCode::kInvalidArgument, "negative stride");
}

TEST(BadInputFirstCall, FailedFirstCallLeavesTheCacheFresh) {
  AnchorKVCache c;
  auto k = random_kv(1, 2, 5, 16, 3);
  k[3] = NAN;
  EXPECT_THROW(c.update_and_fetch(TensorView::f32(k.data(), {1, 2, 5, 16}), TensorView::f32(k.data(), {1, 2, 5, 16})),
               Error);
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.anchorkv_bytes(), 0);
  EXPECT_DOUBLE_EQ(c.compression_ratio(), 1.0);
  // A different shape is still accepted: the failed call fixed nothing.
  const auto ok = random_kv(2, 3, 4, 8, 4);
  EXPECT_NO_THROW(c.update_and_fetch(TensorView::f32(ok.data(), {2, 3, 4, 8}), TensorView::f32(ok.data(), {2, 3, 4, 8})));
  EXPECT_EQ(c.offset(), 4);
}

TEST(BadConfig, EachFieldIsNamed) {
  struct Bad {
    const char* field;
    AnchorKVConfig cfg;
  };
  std::vector<Bad> cases;
  AnchorKVConfig c;
  c = {}; c.theta = -0.1; cases.push_back({"theta", c});
  c = {}; c.theta = 1.5; cases.push_back({"theta", c});
  c = {}; c.theta = NAN; cases.push_back({"theta", c});
  c = {}; c.window = -1; cases.push_back({"window", c});
  c = {}; c.rho = 1.01; cases.push_back({"rho", c});
  c = {}; c.anchor_frac = 0; cases.push_back({"anchor_frac", c});
  c = {}; c.anchor_frac = 1.5; cases.push_back({"anchor_frac", c});
  c = {}; c.residual_bits = 0; cases.push_back({"residual_bits", c});
  c = {}; c.residual_bits = 5; cases.push_back({"residual_bits", c});
  c = {}; c.threads = -2; cases.push_back({"threads", c});
  c = {}; c.key_rope = {true, 1.0, RopeStyle::kNormal, 0, {}}; cases.push_back({"key_rope.base", c});
  c = {}; c.key_rope = {true, NAN, RopeStyle::kNormal, 0, {}}; cases.push_back({"key_rope.base", c});
  c = {}; c.key_rope = {true, 1e4, static_cast<RopeStyle>(7), 0, {}}; cases.push_back({"key_rope.style", c});
  c = {}; c.key_rope = {true, 1e4, RopeStyle::kNeox, -1, {}}; cases.push_back({"key_rope.position_offset", c});
  for (const Bad& b : cases) {
    try {
      AnchorKVCache cache(b.cfg);
      ADD_FAILURE() << b.field << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
      EXPECT_NE(std::string(e.what()).find(b.field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[anchorkv::AnchorKVConfig]"), std::string::npos) << e.what();
    }
  }
  AnchorKVConfig edge;
  edge.theta = 0;
  edge.rho = 0;
  edge.window = 0;
  edge.anchor_frac = 1;
  EXPECT_NO_THROW(edge.validate());
}

}  // namespace
}  // namespace anchorkv
