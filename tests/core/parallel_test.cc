#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace anchorkv::core {
namespace {

TEST(ParallelFor, RunsEveryTaskOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, threads, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads, " << n << " tasks";
    }
  }
}

TEST(ParallelFor, UsesMoreThanOneThreadWhenAsked) {
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  parallel_for(2, 2, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }
    // Both tasks wait for each other: only two threads can finish this.
    arrived++;
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ParallelFor, RethrowsTheFirstErrorAndStaysUsable) {
  EXPECT_THROW(parallel_for(100, 4,
                            [](int64_t i) {
                              if (i == 17) throw std::runtime_error("task 17");
                            }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  parallel_for(100, 4, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ParallelFor, NestedAndConcurrentCallsComplete) {
  // A task that itself calls parallel_for runs the inner loop inline.
  std::atomic<int64_t> inner{0};
  parallel_for(8, 4, [&](int64_t) { parallel_for(10, 4, [&](int64_t j) { inner += j; }); });
  EXPECT_EQ(inner.load(), 8 * 45);
  // Several user threads at once: whoever finds the pool busy runs its own tasks.
  std::vector<std::thread> users;
  std::atomic<int64_t> total{0};
  for (int u = 0; u < 4; ++u)
    users.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) parallel_for(16, 3, [&](int64_t i) { total += i; });
    });
  for (auto& t : users) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 120);
}

TEST(ParallelFor, GroupedRunsEveryTaskOnceInConsecutiveRuns) {
  for (int threads : {1, 2, 3, 8})
    for (int64_t n : {0, 1, 5, 8, 33, 1000}) {
      std::vector<std::atomic<int>> ran(static_cast<size_t>(n));
      std::vector<std::thread::id> by(static_cast<size_t>(n));
      // Uneven costs: a few heavy tasks among many cheap ones (and zero costs, counted as one).
      parallel_for_grouped(
          n, threads, [](int64_t i) { return i % 97 == 0 ? int64_t{5000} : i % 3; },
          [&](int64_t i) {
            ++ran[static_cast<size_t>(i)];
            by[static_cast<size_t>(i)] = std::this_thread::get_id();
          });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ran[static_cast<size_t>(i)].load(), 1) << i;
      // Runs are consecutive: a thread's tasks change owner at most runs - 1 times.
      int64_t changes = 0;
      for (int64_t i = 1; i < n; ++i) changes += by[static_cast<size_t>(i)] != by[static_cast<size_t>(i - 1)];
      EXPECT_LE(changes, std::min<int64_t>(n, 4 * threads)) << n << " tasks, " << threads << " threads";
    }
}

}  // namespace
}  // namespace anchorkv::core
