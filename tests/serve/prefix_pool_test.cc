#include "serve/prefix_pool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

namespace anchorkv::serve {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> seq(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// The block of positions [first, end) of the prompt base, base + 1, ...
BlockInfo block(uint64_t key, uint64_t parent, int first, int end, int32_t base = 0) {
  return {key, parent, first, seq(base + first, end - first)};
}

// A "file" that names its block (the pool never parses blocks; accept() here does).
std::vector<uint8_t> bytes_of(const BlockInfo& b, size_t size) {
  std::vector<uint8_t> out(std::max<size_t>(size, 28), 0);
  const int32_t first = static_cast<int32_t>(b.first), end = static_cast<int32_t>(b.end()),
                base = b.tokens.empty() ? 0 : b.tokens[0] - first;
  std::memcpy(&out[0], &b.key, 8);
  std::memcpy(&out[8], &b.parent, 8);
  std::memcpy(&out[16], &first, 4);
  std::memcpy(&out[20], &end, 4);
  std::memcpy(&out[24], &base, 4);
  return out;
}

PrefixPool::Accept accept_named() {
  return [](const uint8_t* data, size_t size, const std::string&) -> std::optional<BlockInfo> {
    if (size < 28) return std::nullopt;
    uint64_t key, parent;
    int32_t first, end, base;
    std::memcpy(&key, data, 8);
    std::memcpy(&parent, data + 8, 8);
    std::memcpy(&first, data + 16, 4);
    std::memcpy(&end, data + 20, 4);
    std::memcpy(&base, data + 24, 4);
    return block(key, parent, first, end, base);
  };
}

void add(PrefixPool& pool, const BlockInfo& b, size_t size = 100) { pool.add(b, bytes_of(b, size)); }

fs::path scratch(const char* name) {
  fs::path d =
      fs::temp_directory_path() / (std::string("anchorkv_pool_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<uint64_t> keys_of(const std::optional<std::vector<PrefixPool::Block>>& chain) {
  std::vector<uint64_t> k;
  if (chain)
    for (const auto& b : *chain) k.push_back(b.info.key);
  return k;
}

// Whether the folder holds a spill of block `key` (block-KEY-SERIAL.akvc).
bool has_file_of(const fs::path& dir, uint64_t key) {
  char prefix[40];
  std::snprintf(prefix, sizeof prefix, "block-%016llx-", static_cast<unsigned long long>(key));
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(PrefixPool, LongestChainFollowsItsLinksWithinTheLimit) {
  PrefixPool pool({1 << 20, ""}, accept_named());
  add(pool, block(1, 0, 0, 10));
  add(pool, block(2, 1, 10, 20));
  add(pool, block(3, 2, 20, 30));
  add(pool, block(4, 1, 10, 15, 100));  // tokens that begin no prompt of 0, 1, 2, ...
  add(pool, block(5, 1, 12, 22));       // says it follows block 1, which ends at 10: no link
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 25), 25)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 40), 40)), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 25), 19)),
            (std::vector<uint64_t>{1}));  // a block past the limit is passed over
  EXPECT_FALSE(pool.longest_chain(seq(1, 25), 25));
  EXPECT_EQ(pool.shared_prefix(seq(0, 15)), 15);
  std::vector<int32_t> diverges = seq(0, 40);
  diverges[23] = 999;  // inside block 3, after a chain of 1 and 2
  EXPECT_EQ(pool.shared_prefix(diverges), 23);
  diverges[13] = 999;  // inside block 2: block 3 no longer follows
  EXPECT_EQ(pool.shared_prefix(diverges), 13);
  PoolMetrics m = pool.metrics();
  EXPECT_EQ(m.hits, 3);
  EXPECT_EQ(m.misses, 1);
  EXPECT_EQ(m.entries, 5);
  EXPECT_EQ(m.bytes, 500);
  // Dropping a block drops every block after it: the chain ends before it.
  pool.discard(2);
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 40), 40)), (std::vector<uint64_t>{1}));
  m = pool.metrics();
  EXPECT_EQ(m.bad_entries, 1);
  EXPECT_EQ(m.entries, 3);  // 1, 4 and 5 (5 never linked to 2)
}

// The pool finds chains through its indexes; the same answers come from
// scanning every block (a reference written the plain way).
TEST(PrefixPool, IndexedLookupsEqualAScanOfEveryBlock) {
  std::mt19937 rng(7);
  PrefixPool pool({1 << 30, ""}, accept_named());
  std::vector<BlockInfo> held;
  uint64_t next_key = 1;
  auto token = [&] { return static_cast<int32_t>(rng() % 3); };  // few symbols: long shared beginnings
  for (int i = 0; i < 300; ++i) {
    BlockInfo b;
    if (held.empty() || rng() % 3 == 0) {
      b = {next_key++, 0, 0, {}};
      b.tokens.resize(1 + rng() % 6);
    } else {
      const BlockInfo& parent = held[rng() % held.size()];
      b = {next_key++, parent.key, parent.end(), {}};
      b.tokens.resize(1 + rng() % 4);
    }
    for (auto& t : b.tokens) t = token();
    held.push_back(b);
    pool.add(b, std::vector<uint8_t>(8));
  }
  for (int q = 0; q < 300; ++q) {
    std::vector<int32_t> prompt(1 + rng() % 14);
    for (auto& t : prompt) t = token();
    // Reference: the longest chain end, and the longest agreement of any block that starts where a
    // matching chain (or the prompt) starts.
    std::function<void(const BlockInfo&, int64_t&)> longest = [&](const BlockInfo& b, int64_t& best) {
      best = std::max(best, b.end());
      for (const BlockInfo& c : held)
        if (c.first > 0 && c.parent == b.key && c.first == b.end() && c.matches(prompt)) longest(c, best);
    };
    int64_t want_end = 0, want_shared = 0;
    auto agree = [&](const BlockInfo& b) {
      int64_t i = 0;
      while (i < static_cast<int64_t>(b.tokens.size()) && b.first + i < static_cast<int64_t>(prompt.size()) &&
             b.tokens[static_cast<size_t>(i)] == prompt[static_cast<size_t>(b.first + i)])
        ++i;
      return b.first + i;
    };
    std::function<void(const BlockInfo&)> shared = [&](const BlockInfo& b) {
      want_shared = std::max(want_shared, b.end());
      for (const BlockInfo& c : held)
        if (c.first > 0 && c.parent == b.key && c.first == b.end()) {
          want_shared = std::max(want_shared, agree(c));
          if (c.matches(prompt)) shared(c);
        }
    };
    for (const BlockInfo& b : held)
      if (b.first == 0) {
        want_shared = std::max(want_shared, agree(b));
        if (b.matches(prompt)) {
          longest(b, want_end);
          shared(b);
        }
      }
    const auto chain = pool.longest_chain(prompt, prompt.size());
    EXPECT_EQ(chain ? chain->back().info.end() : 0, want_end);
    EXPECT_EQ(pool.shared_prefix(prompt), want_shared);
    if (q % 10 == 0) {  // and after blocks leave
      const uint64_t k = held[rng() % held.size()].key;
      pool.discard(k);
      std::vector<uint64_t> gone{k};
      for (size_t i = 0; i < gone.size(); ++i)
        for (const BlockInfo& c : held)
          if (c.first > 0 && c.parent == gone[i]) gone.push_back(c.key);
      std::erase_if(held, [&](const BlockInfo& b) { return std::count(gone.begin(), gone.end(), b.key) > 0; });
      ASSERT_EQ(pool.metrics().entries, static_cast<int64_t>(held.size()));
    }
  }
}

TEST(PrefixPool, PromptsThatShareABeginningShareItsBlocks) {
  PrefixPool pool({1 << 20, ""}, accept_named());
  add(pool, block(1, 0, 0, 10));
  add(pool, block(2, 1, 10, 20));
  add(pool, block(1, 0, 0, 10));      // the same block again: refreshed, held once
  add(pool, block(3, 1, 10, 18, 0));  // another continuation of block 1
  EXPECT_EQ(pool.metrics().bytes, 300);
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 18), 18)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 20), 20)), (std::vector<uint64_t>{1, 2}));
}

TEST(PrefixPool, BudgetSpillsToTheFolderAndBadBlocksAreDropped) {
  const fs::path dir = scratch("spill");
  {
    PrefixPool pool({250, dir.string()}, accept_named());
    for (int i = 1; i <= 4; ++i)
      add(pool, block(static_cast<uint64_t>(i), static_cast<uint64_t>(i - 1), 10 * (i - 1), 10 * i));
    PoolMetrics m = pool.metrics();
    EXPECT_LE(m.bytes, 250);
    EXPECT_EQ(m.disk_entries, 2);
    // Blocks 1 and 2 were spilled first: the chain reads them back from the folder.
    EXPECT_EQ(keys_of(pool.longest_chain(seq(0, 45), 45)), (std::vector<uint64_t>{1, 2, 3, 4}));
    m = pool.metrics();
    EXPECT_EQ(m.disk_hits, 2);
    EXPECT_LE(m.bytes, 250);
    pool.discard(1);
    EXPECT_EQ(pool.metrics().bad_entries, 1);
    EXPECT_FALSE(pool.longest_chain(seq(0, 12), 12));
    for (int i = 1; i <= 4; ++i)
      add(pool, block(static_cast<uint64_t>(i), static_cast<uint64_t>(i - 1), 10 * (i - 1), 10 * i));
  }
  // A new pool indexes the folder; an unreadable file is dropped, a FIFO never opened.
  ASSERT_EQ(::mkfifo((dir / "block-77.akvc").c_str(), 0600), 0);
  std::ofstream(dir / ".block-0000000000000078.akvc.tmp.XyZ123") << "half";
  PrefixPool again({250, dir.string()}, accept_named());
  EXPECT_FALSE(fs::exists(dir / ".block-0000000000000078.akvc.tmp.XyZ123"));
  const int64_t indexed = again.metrics().disk_entries;
  EXPECT_GE(indexed, 1);
  for (const auto& f : fs::directory_iterator(dir))
    if (f.is_regular_file()) fs::remove(f.path());  // every spilled file vanishes
  EXPECT_FALSE(again.longest_chain(seq(0, 45), 45));
  EXPECT_GE(again.metrics().bad_entries, 1);
  EXPECT_EQ(again.metrics().disk_entries, 0);
  fs::remove_all(dir);
}

// The folder keeps its budget: the oldest spilled blocks go first, with the
// blocks after them (a chain without its beginning is reached by nothing).
TEST(PrefixPool, TheFolderKeepsItsBudgetOldestChainsFirst) {
  const fs::path dir = scratch("folder_budget");
  PrefixPool pool({250, dir.string(), 250}, accept_named());
  for (int32_t base : {0, 100, 200}) {  // three chains of two 100-byte blocks
    const auto k = static_cast<uint64_t>(base + 1);
    add(pool, block(k, 0, 0, 10, base));
    add(pool, block(k + 1, k, 10, 20, base));
  }
  const PoolMetrics m = pool.metrics();
  EXPECT_EQ(m.disk_evictions, 2);  // the first chain, both blocks
  EXPECT_EQ(m.disk_entries, 2);
  EXPECT_LE(m.disk_bytes, 250);
  EXPECT_FALSE(has_file_of(dir, 1));
  EXPECT_FALSE(has_file_of(dir, 2));
  EXPECT_TRUE(has_file_of(dir, 101));
  EXPECT_FALSE(pool.longest_chain(seq(0, 20), 20));
  EXPECT_EQ(keys_of(pool.longest_chain(seq(100, 20), 20)), (std::vector<uint64_t>{101, 102}));
  EXPECT_EQ(keys_of(pool.longest_chain(seq(200, 20), 20)), (std::vector<uint64_t>{201, 202}));
  int files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.is_regular_file();
  EXPECT_EQ(files, pool.metrics().disk_entries);
  fs::remove_all(dir);
}

// Readers and writers at once, with spills and read-backs through a folder:
// every chain returned starts at token 0, links block to block, and begins
// the prompt (run under TSan).
TEST(PrefixPool, ConcurrentUseKeepsEveryChainLinkedAndAPrefix) {
  const fs::path dir = scratch("threads");
  PrefixPool pool({2000, dir.string()}, accept_named());
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int blocks = 1 + (i * 7 + t) % 5;  // a chain of 10-token blocks, keys 1..5
        if (i % 3 == 0)
          for (int b = 1; b <= blocks; ++b)
            add(pool, block(static_cast<uint64_t>(b), static_cast<uint64_t>(b - 1), 10 * (b - 1), 10 * b),
                150);
        const auto prompt = seq(0, 1 + (i * 11 + t) % 60);
        if (auto chain = pool.longest_chain(prompt, prompt.size())) {
          int64_t end = 0;
          uint64_t parent = 0;
          for (const auto& b : *chain) {
            if (b.info.first != end || (end > 0 && b.info.parent != parent) || !b.info.matches(prompt) ||
                accept_named()(b.file->data(), b.file->size(), "")->key != b.info.key)
              ++wrong;
            end = b.info.end();
            parent = b.info.key;
          }
          if (i % 17 == 0) pool.discard(chain->back().info.key);
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

// The first bytes held under a key win: adding the key again, spilling it
// and reading it back never change them.
TEST(PrefixPool, AKeysBytesNeverChange) {
  const fs::path dir = scratch("first_wins");
  PrefixPool pool({250, dir.string()}, accept_named());
  const BlockInfo b = block(1, 0, 0, 10);
  std::vector<uint8_t> first = bytes_of(b, 100), second = first;
  second[99] = 7;
  pool.add(b, first);
  pool.add(b, second);
  EXPECT_EQ(*pool.longest_chain(seq(0, 10), 10)->front().file, first);
  for (int i = 2; i <= 4; ++i) add(pool, block(static_cast<uint64_t>(i), 0, 0, 10, 100 * i));  // spills 1
  EXPECT_TRUE(has_file_of(dir, 1));
  pool.add(b, second);  // held in the folder: still the first bytes
  EXPECT_EQ(*pool.longest_chain(seq(0, 10), 10)->front().file, first);  // read back
  EXPECT_EQ(*pool.longest_chain(seq(0, 10), 10)->front().file, first);  // from memory
  fs::remove_all(dir);
}

// While other threads push a block out to the folder and read it back over
// and over, it is found every time, with its first bytes (before, a block
// was in no tier between leaving memory and its file being written).
TEST(PrefixPool, ABlockIsFoundAtEveryInstantOfItsMovesBetweenTiers) {
  const fs::path dir = scratch("moves");
  PrefixPool pool({300, dir.string()}, accept_named());
  const BlockInfo b = block(1, 0, 0, 10);
  const std::vector<uint8_t> first = bytes_of(b, 100);
  pool.add(b, first);
  std::atomic<bool> done{false};
  std::atomic<int> missing{0}, changed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t)
    ts.emplace_back([&, t] {  // fillers: every add pushes the least recently used block out
      for (int i = 0; i < 300; ++i) {
        add(pool, block(static_cast<uint64_t>(100 + 1000 * t + i), 0, 0, 10, 1000 + 1000 * t + i));
        std::vector<uint8_t> other = first;
        other[99] = static_cast<uint8_t>(i + 1);
        pool.add(b, other);  // a recomputation of block 1: must not replace it
      }
    });
  ts.emplace_back([&] {
    while (!done) {
      const auto chain = pool.longest_chain(seq(0, 10), 10);
      if (!chain)
        ++missing;
      else if (*chain->front().file != first)
        ++changed;
    }
  });
  for (size_t i = 0; i + 1 < ts.size(); ++i) ts[i].join();
  done = true;
  ts.back().join();
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(changed, 0);
  int files = 0;  // every file in the folder is a block the pool holds there (none untracked)
  for (const auto& f : fs::directory_iterator(dir)) files += f.is_regular_file();
  EXPECT_EQ(files, pool.metrics().disk_entries);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace anchorkv::serve
