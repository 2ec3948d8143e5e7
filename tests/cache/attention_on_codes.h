// The check every cache that attends on its codes passes (TurboQuant, group
// quantization, KIVI): the same bits for 1 and 2 threads, the scalar twin
// within float rounding, and dense attention over the cache's fetch within
// the fetch's fp16 rounding, for decode and for queries inside the cache.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"

namespace anchorkv::testing_util {

// `c`'s dense fetch appended to `dense`.
inline void copy_fetch(const KVCache& c, FullKVCache& dense) {
  const KVPair rec = c.fetch();
  dense.update(TensorView::f16(rec.keys.data_as<uint16_t>(), rec.keys.shape()),
               TensorView::f16(rec.values.data_as<uint16_t>(), rec.values.shape()));
}

// G query heads per KV head; `what` names the case in failures.
inline void expect_attention_on_codes(const KVCache& c, int64_t G, const std::string& what) {
  const Shape4 shape = c.fetch().keys.shape();
  const int64_t B = shape[0], H = shape[1], D = shape[3];
  FullKVCache dense;
  copy_fetch(c, dense);
  for (int64_t Sq : {1, 5}) {
    const auto q = random_kv(B, H * G, Sq, D, 9);
    const TensorView qv = TensorView::f32(q.data(), {B, H * G, Sq, D});
    AttentionOptions one;
    one.threads = 1;
    AttentionOptions two = one, ref = one;
    two.threads = 2;
    ref.reference = true;
    const auto y = attend(qv, c, one).to_f32();
    EXPECT_EQ(y, attend(qv, c, two).to_f32()) << what << " Sq " << Sq;
    EXPECT_LE(nmse(attend(qv, c, ref).to_f32(), y), 1e-10) << what << " Sq " << Sq;
    // Within the fetch's fp16 rounding, and not the fetch itself (the codes are read in f32).
    const double off_fetch = nmse(attend(qv, dense, one).to_f32(), y);
    EXPECT_LE(off_fetch, 1e-5) << what << " Sq " << Sq;
    EXPECT_GT(off_fetch, 0) << what << " Sq " << Sq;
  }
}

}  // namespace anchorkv::testing_util
