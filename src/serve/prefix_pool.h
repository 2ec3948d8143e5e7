// The server's pool of prompt prefixes: each entry is a prompt's caches as
// cache-file bytes (compressed for AnchorKV) with the tokens they cover. It
// holds at most `budget` bytes in memory, least recently used first out;
// with a folder, entries leaving memory are written there and read back on a
// hit. Choices are made under the pool's own lock; reading and writing files
// happen outside it, so a slow disk delays only the request that needs it.
//
// The pool trusts nothing it reads back: a spilled file may be damaged or
// replaced after it was indexed. Callers validate an entry when they use it
// and discard() it when it is bad (counted in bad_entries); a file that
// cannot be read is dropped here the same way. Files written by an earlier
// run are indexed at start when `accept` takes them.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace anchorkv::serve {

struct PoolOptions {
  int64_t budget = int64_t{1} << 30;  // bytes held in memory
  std::string folder;                 // spill folder; empty: evicted entries are dropped
};

struct PoolMetrics {
  int64_t hits = 0, misses = 0;
  int64_t entries = 0, bytes = 0, evictions = 0;
  int64_t disk_entries = 0, disk_bytes = 0, disk_hits = 0;
  int64_t bad_entries = 0;  // damaged, foreign or unreadable entries dropped
  int64_t disk_errors = 0;  // spills or removals the folder refused
};

class PrefixPool {
 public:
  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;
  struct Entry {
    std::vector<int32_t> tokens;
    Bytes file;
  };
  // `accept(bytes, path)` gives the tokens a file found in the folder at
  // start covers, or nothing when it is not one of this server's (another
  // model or cache, damaged); such files are left alone.
  using Accept = std::function<std::optional<std::vector<int32_t>>(const uint8_t*, size_t, const std::string&)>;
  PrefixPool(PoolOptions options, const Accept& accept);

  // The entry with the longest token list that begins `prompt` and covers at
  // most `max_tokens` of it (memory first, then the folder: such an entry
  // comes back into memory). Counts a hit or a miss.
  std::optional<Entry> longest_prefix(const std::vector<int32_t>& prompt, size_t max_tokens);
  // The longest beginning `prompt` shares with any entry.
  int64_t shared_prefix(const std::vector<int32_t>& prompt) const;
  // Adds (or refreshes) the entry for `tokens`; entries over the budget leave memory.
  void add(std::vector<int32_t> tokens, std::vector<uint8_t> file);
  // Drops the entry for `tokens` (a caller found it bad): counted in bad_entries.
  void discard(const std::vector<int32_t>& tokens);
  PoolMetrics metrics() const;

 private:
  struct Spilled {
    std::vector<int32_t> tokens;
    std::string path;
    int64_t bytes = 0;
  };
  // Under mu_: moves entries out of memory until `incoming` more bytes fit;
  // returns those to write to the folder (done by spill(), outside mu_).
  std::vector<Entry> make_room(int64_t incoming);
  void spill(std::vector<Entry> victims);
  std::optional<Entry> read_back(Spilled s);
  void index_folder(const Accept& accept);

  const PoolOptions opt_;
  mutable std::mutex mu_;
  std::list<Entry> memory_;  // most recently used first
  int64_t memory_bytes_ = 0;
  std::vector<Spilled> disk_;
  int64_t next_file_ = 0;
  PoolMetrics counts_;  // the counters (entries and bytes are computed)
};

}  // namespace anchorkv::serve
