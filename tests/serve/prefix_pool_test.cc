#include "serve/prefix_pool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

namespace anchorkv::serve {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> seq(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}
// A "file" whose bytes name its tokens (the pool never parses entries).
std::vector<uint8_t> bytes_of(const std::vector<int32_t>& t, size_t size) {
  std::vector<uint8_t> b(size, static_cast<uint8_t>(t.size()));
  return b;
}

fs::path scratch(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string("anchorkv_pool_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

PrefixPool::Accept accept_by_size() {
  return [](const uint8_t* data, size_t size, const std::string&) -> std::optional<std::vector<int32_t>> {
    if (size == 0) return std::nullopt;
    return seq(0, data[0]);
  };
}

TEST(PrefixPool, LongestPrefixFirstAndWithinTheLimit) {
  PrefixPool pool({1 << 20, ""}, accept_by_size());
  pool.add(seq(0, 10), bytes_of(seq(0, 10), 100));
  pool.add(seq(0, 20), bytes_of(seq(0, 20), 100));
  pool.add(seq(5, 30), bytes_of(seq(5, 30), 100));
  const auto prompt = seq(0, 25);
  auto hit = pool.longest_prefix(prompt, prompt.size());
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tokens.size(), 20u);
  hit = pool.longest_prefix(prompt, 19);  // an entry covering more than the limit is passed over
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tokens.size(), 10u);
  EXPECT_FALSE(pool.longest_prefix(seq(1, 25), 25));
  EXPECT_EQ(pool.shared_prefix(seq(0, 15)), 15);
  const PoolMetrics m = pool.metrics();
  EXPECT_EQ(m.hits, 2);
  EXPECT_EQ(m.misses, 1);
  EXPECT_EQ(m.entries, 3);
  EXPECT_EQ(m.bytes, 300);
}

TEST(PrefixPool, BudgetSpillsToTheFolderAndBadEntriesAreDropped) {
  const fs::path dir = scratch("spill");
  {
    PrefixPool pool({250, dir.string()}, accept_by_size());
    for (int i = 1; i <= 4; ++i) pool.add(seq(0, 10 * i), bytes_of(seq(0, 10 * i), 100));
    PoolMetrics m = pool.metrics();
    EXPECT_LE(m.bytes, 250);
    EXPECT_EQ(m.disk_entries, 2);
    auto hit = pool.longest_prefix(seq(0, 12), 12);  // {0..9} was spilled first: read back from the folder
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->tokens.size(), 10u);
    m = pool.metrics();
    EXPECT_EQ(m.disk_hits, 1);
    pool.discard(hit->tokens);
    EXPECT_EQ(pool.metrics().bad_entries, 1);
    EXPECT_FALSE(pool.longest_prefix(seq(0, 12), 12));
  }
  // A new pool indexes the folder; an unreadable spilled file is dropped, a FIFO never opened.
  ASSERT_EQ(::mkfifo((dir / "prefix-77.akvc").c_str(), 0600), 0);
  std::ofstream(dir / ".prefix-78.akvc.tmp.XyZ123") << "half";
  PrefixPool again({250, dir.string()}, accept_by_size());
  EXPECT_FALSE(fs::exists(dir / ".prefix-78.akvc.tmp.XyZ123"));
  const int64_t indexed = again.metrics().disk_entries;
  EXPECT_GE(indexed, 1);
  for (const auto& f : fs::directory_iterator(dir))
    if (f.is_regular_file()) fs::remove(f.path());  // every spilled file vanishes
  EXPECT_FALSE(again.longest_prefix(seq(0, 45), 45));
  EXPECT_EQ(again.metrics().bad_entries, indexed);
  fs::remove_all(dir);
}

// Readers and writers at once, with spills and read-backs through a folder:
// no entry is ever returned for a prompt it does not begin (run under TSan).
TEST(PrefixPool, ConcurrentUseKeepsEveryAnswerAPrefix) {
  const fs::path dir = scratch("threads");
  PrefixPool pool({2000, dir.string()}, accept_by_size());
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int n = 1 + (i * 7 + t) % 40;
        if (i % 3 == 0) pool.add(seq(0, n), bytes_of(seq(0, n), 150));
        const auto prompt = seq(0, 1 + (i * 11 + t) % 50);
        if (auto hit = pool.longest_prefix(prompt, prompt.size())) {
          if (hit->tokens.size() > prompt.size() || (*hit->file)[0] != hit->tokens.size()) ++wrong;
          if (i % 17 == 0) pool.discard(hit->tokens);
        }
        (void)pool.shared_prefix(prompt);
        (void)pool.metrics();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_LE(pool.metrics().bytes, 2000);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace anchorkv::serve
