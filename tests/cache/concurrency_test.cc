// Several threads on one cache: writers append decode tokens while readers
// attend, fetch and read the accounting. Every decode token is the same
// vector, so the state after n tokens does not depend on which writer added
// them: each reader's result must equal the serial run's at some n.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"

namespace anchorkv {
namespace {

using testing_util::random_kv;

constexpr int64_t B = 1, H = 2, Hq = 4, S = 256, D = 64;
constexpr int kWriters = 2, kReaders = 2, kStepsPerWriter = 12;

struct Serial {
  std::vector<std::vector<float>> attention;  // [n - S] attend output with n tokens
  std::vector<KVPair> fetched;                // [n - S] the fetch with n tokens
  KVPair final_kv;
};

std::vector<float> attend_last(const KVCache& c, const std::vector<float>& q) {
  AttentionOptions o;
  o.threads = 1;
  return attend(TensorView::f32(q.data(), {B, Hq, 1, D}), c, o).to_f32();
}

void hammer(const std::function<std::unique_ptr<KVCache>()>& make) {
  const auto K = random_kv(B, H, S, D, 1), V = random_kv(B, H, S, D, 2);
  const auto step = random_kv(B, H, 1, D, 3), q = random_kv(B, Hq, 1, D, 4);
  const int64_t total = kWriters * kStepsPerWriter;
  // The serial run: every state a reader may observe.
  Serial serial;
  {
    auto c = make();
    c->update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
    serial.attention.push_back(attend_last(*c, q));
    serial.fetched.push_back(c->fetch());
    for (int64_t i = 0; i < total; ++i) {
      c->update(TensorView::f32(step.data(), {B, H, 1, D}), TensorView::f32(step.data(), {B, H, 1, D}));
      serial.attention.push_back(attend_last(*c, q));
      serial.fetched.push_back(c->fetch());
    }
    serial.final_kv = c->fetch();
  }
  auto cache = make();
  cache->update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
  std::atomic<int> writers_left{kWriters}, mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w)
    threads.emplace_back([&] {
      for (int i = 0; i < kStepsPerWriter; ++i) {
        try {
          if (i % 2 == 0)
            cache->update(TensorView::f32(step.data(), {B, H, 1, D}), TensorView::f32(step.data(), {B, H, 1, D}));
          else  // update_and_fetch returns the state right after its own tokens
            if (cache->update_and_fetch(TensorView::f32(step.data(), {B, H, 1, D}),
                                        TensorView::f32(step.data(), {B, H, 1, D}))
                    .keys.shape()[2] < S + 1)
              ++mismatches;
        } catch (...) {
          ++errors;
        }
      }
      --writers_left;
    });
  for (int r = 0; r < kReaders; ++r)
    threads.emplace_back([&, r] {
      do {
        try {
          const std::vector<float> y = attend_last(*cache, q);
          bool found = false;
          for (const auto& s : serial.attention) found = found || s == y;
          if (!found) ++mismatches;
          const KVPair kv = cache->fetch();
          const int64_t n = kv.keys.shape()[2];
          // The fetch equals the serial run's with the same n tokens (a
          // streaming cache compresses older tokens as n grows).
          if (n < S || n > S + total) {
            ++mismatches;
          } else {
            const Tensor& want = serial.fetched[static_cast<size_t>(n - S)].values;
            if (!std::equal(kv.values.data_as<uint16_t>(), kv.values.data_as<uint16_t>() + kv.values.numel(),
                            want.data_as<uint16_t>()))
              ++mismatches;
          }
          if (r == 0 && cache->tokens_total() % (B * H) != 0) ++mismatches;
          if (cache->nbytes() <= 0 || cache->compression_ratio() <= 0) ++mismatches;
        } catch (...) {
          ++errors;
        }
      } while (writers_left.load() > 0);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(cache->offset(), S + total) << "every appended token is counted once";
  EXPECT_EQ(cache->tokens_total(), B * H * (S + total));
  const KVPair kv = cache->fetch();
  EXPECT_EQ(testing_util::bits_of(kv.keys), testing_util::bits_of(serial.final_kv.keys));
  EXPECT_EQ(testing_util::bits_of(kv.values), testing_util::bits_of(serial.final_kv.values));
}

TEST(Concurrency, AnchorKVWritersAndReaders) {
  hammer([] {
    AnchorKVConfig c;
    c.theta = 0.1;
    c.threads = 1;
    return std::make_unique<AnchorKVCache>(c);
  });
}

TEST(Concurrency, AnchorKVCompactWritersAndReaders) {
  hammer([] {
    AnchorKVConfig c;
    c.metadata = MetadataLayout::kCompact;
    c.threads = 1;
    return std::make_unique<AnchorKVCache>(c);
  });
}

// Writers close segments (every 8 tokens behind a window of 4, on their own or
// extending the one before) while readers attend.
TEST(Concurrency, StreamingAnchorKVWritersAndReaders) {
  for (int64_t extend : {0, 64}) {  // 64: segments extend the one before (replaced under the writer's lock)
    hammer([extend] {
      AnchorKVConfig c;
      c.theta = 0.2;
      c.threads = 1;
      c.metadata = MetadataLayout::kTight;
      c.segment_tokens = 8;
      c.recent_tokens = 4;
      c.extend_tokens = extend;
      return std::make_unique<AnchorKVCache>(c);
    });
  }
}

TEST(Concurrency, FullWritersAndReaders) {
  hammer([] { return std::make_unique<FullKVCache>(); });
}

TEST(Concurrency, BaselinesWritersAndReaders) {
  hammer([] { return std::make_unique<KIVICache>(2); });
  hammer([] { return std::make_unique<QuantizedKVCache>(4); });
  hammer([] { return std::make_unique<TurboQuantCache>(2.5, 2); });  // attends on its codes
}

// Errors under contention still leave the cache untouched.
TEST(Concurrency, BadInputFromOneThreadDoesNotDisturbOthers) {
  AnchorKVCache cache;
  const auto K = random_kv(B, H, S, D, 1);
  cache.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(K.data(), {B, H, S, D}));
  std::atomic<int> rejected{0};
  std::vector<std::thread> threads;
  const auto bad = random_kv(B, H + 1, 1, D, 5);
  const auto good = random_kv(B, H, 1, D, 6);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        try {
          if (t % 2 == 0)
            cache.update(TensorView::f32(bad.data(), {B, H + 1, 1, D}), TensorView::f32(bad.data(), {B, H + 1, 1, D}));
          else
            cache.update(TensorView::f32(good.data(), {B, H, 1, D}), TensorView::f32(good.data(), {B, H, 1, D}));
        } catch (const Error&) {
          ++rejected;
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(rejected.load(), 20);
  EXPECT_EQ(cache.offset(), S + 20);
}

}  // namespace
}  // namespace anchorkv
