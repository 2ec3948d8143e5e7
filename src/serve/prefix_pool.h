// The server's pool of prompt prefixes, kept as chains of blocks. A block is
// one run of a prompt's tokens with its caches as cache-file bytes (for a
// streaming AnchorKV cache, one compressed segment of every layer); it names
// the block before it by key, so a prompt is a chain from a first block
// (first token 0) to its last, and prompts that share a beginning share its
// blocks. Keys are chained hashes the caller computes (runtime/prefix_chain.h);
// the pool only links blocks by them and never trusts them alone: a block
// carries its own token ids, and a chain is followed only where each block
// starts where its parent ends and its tokens are the prompt's there; callers
// verify the bytes when they use them.
//
// It holds at most `budget` bytes in memory, least recently used first out
// (a chain's blocks are all used when it is); with a folder, blocks leaving
// memory are written there and read back on a hit, and at most `disk_budget`
// bytes of them stay there (the oldest spilled go first, with the blocks after
// them). Choices are made under
// the pool's own lock; reading and writing files happen outside it, so a slow
// disk delays only the request that needs it.
//
// A spilled file may be damaged or replaced after it was indexed: callers
// discard() a block they find bad (counted in bad_entries; the blocks after
// it go with it); a file that cannot be read is dropped here the same way.
// Files written by an earlier run are indexed at start when `accept` takes them.
#pragma once

#include <chrono>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/block_info.h"

namespace anchorkv::serve {

struct PoolOptions {
  int64_t budget = int64_t{1} << 30;  // bytes held in memory
  std::string folder;                 // spill folder; empty: evicted blocks are dropped
  int64_t disk_budget = 0;            // bytes of spilled blocks in the folder; 0: no bound
};

struct PoolMetrics {
  int64_t hits = 0, misses = 0;
  int64_t entries = 0, bytes = 0, evictions = 0;  // blocks in memory
  int64_t disk_entries = 0, disk_bytes = 0, disk_hits = 0;
  int64_t bad_entries = 0;  // damaged, foreign or unreadable blocks dropped
  int64_t disk_errors = 0;  // spills or removals the folder refused
  int64_t disk_evictions = 0;  // spilled blocks removed for the folder's budget (with the blocks after them)
};

using runtime::BlockInfo;

// What persist() wrote to the folder, and what it could not (no folder, its
// budget, an error, or the deadline).
struct PoolPersisted {
  int64_t blocks = 0, bytes = 0;
  int64_t left = 0;
};

class PrefixPool {
 public:
  using Block = runtime::HeldBlock;
  // `accept(bytes, path)` gives what a file found in the folder at start is,
  // or nothing when it is not one of this server's (another model or cache,
  // damaged); such files are left alone.
  using Accept = std::function<std::optional<BlockInfo>(const uint8_t*, size_t, const std::string&)>;
  PrefixPool(PoolOptions options, const Accept& accept);

  // The longest chain whose blocks all begin `prompt`, whose last ends at
  // most `max_tokens` into it, and whose every link is held (memory first,
  // then the folder: such blocks come back into memory). First block first.
  // Counts a hit or a miss.
  std::optional<std::vector<Block>> longest_chain(const std::vector<int32_t>& prompt, size_t max_tokens);
  // The longest beginning `prompt` shares with any block.
  int64_t shared_prefix(const std::vector<int32_t>& prompt) const;
  // Adds a block; blocks over the budget leave memory. The first bytes held
  // under a key win: adding a key held already (in memory, leaving or in
  // the folder) only refreshes it, so a key's bytes never change while any
  // tier holds it.
  void add(Block block);
  void add(BlockInfo info, std::vector<uint8_t> file) {
    add({std::move(info), std::make_shared<const std::vector<uint8_t>>(std::move(file))});
  }
  // Drops the block `key` and every block after it (a caller found it bad):
  // counted in bad_entries.
  void discard(uint64_t key);
  // Before the process exits: writes the blocks held in memory to the
  // folder, most recently used first, as many as its budget holds, until
  // `deadline`; they are held there from then on (the newest spills), so a
  // restart indexes them.
  PoolPersisted persist(std::chrono::steady_clock::time_point deadline);
  PoolMetrics metrics() const;

 private:
  struct Spilled {
    BlockInfo info;
    std::string path;
    int64_t bytes = 0;
  };
  using MemoryAt = std::list<Block>::iterator;
  using DiskAt = std::list<Spilled>::iterator;
  // Where a held block is: in memory, on its way to the folder (its bytes
  // still here and served, no longer counted against the budget), or in the
  // folder. A block is findable at every instant of its moves.
  enum class Tier : uint8_t { kMemory, kLeaving, kDisk };
  struct Where {
    Tier tier = Tier::kMemory;
    MemoryAt memory;  // kMemory: in memory_; kLeaving: in leaving_
    DiskAt disk;      // kDisk
  };
  // Under mu_: the keys of the longest held chain (nothing when none).
  std::vector<uint64_t> find_chain(const std::vector<int32_t>& prompt, size_t max_tokens) const;
  template <typename Visit>
  void walk_chains(const std::vector<int32_t>& prompt, Visit&& visit) const;
  // Under mu_: the held blocks after `parent` (first blocks: after their root).
  template <typename Each>
  void each_child(uint64_t parent, Each&& each) const;
  const BlockInfo* find(uint64_t key) const;
  // Under mu_: whether block `key` is held in the folder, in the file `path`.
  bool spilled_at(uint64_t key, const std::string& path) const;
  // Under mu_: the indexes follow every insertion and removal.
  void index_first(const BlockInfo& info);
  void unindex_first(const BlockInfo& info);
  void hold_in_memory(Block block);  // most recently used
  void hold_on_disk(Spilled s);      // newest spill
  void unhold(uint64_t key);         // from memory or the folder, with its bytes
  // Under mu_: moves blocks out of memory until `incoming` more bytes fit:
  // dropped without a folder, else leaving and returned, for spill() to
  // write outside mu_.
  std::vector<Block> make_room(int64_t incoming);
  void spill(std::vector<Block> victims);
  // Under mu_: a block `written` to `path` joins the folder's blocks if it
  // is still held in `from` with the same bytes; false when it is not (then
  // the file is the caller's to remove).
  bool settle_on_disk(const Block& written, const std::string& path, Tier from);
  std::string new_file(uint64_t key);  // a name no earlier spill of this pool used
  std::shared_ptr<const std::vector<uint8_t>> read_spilled(const Spilled& s);
  void keep_read_back(const Block& b, const std::string& path);
  void index_folder(const Accept& accept);
  // Under mu_: drops block `key` and every block after it, memory and folder
  // (their files into `files`, removed outside mu_). Returns how many.
  int64_t drop_from(uint64_t key, std::vector<std::string>& files);
  void remove_files(const std::vector<std::string>& files);

  const PoolOptions opt_;
  mutable std::mutex mu_;
  std::list<Block> memory_;  // most recently used first
  int64_t memory_bytes_ = 0;
  std::list<Block> leaving_;  // being written to the folder
  std::atomic<uint64_t> file_serial_;
  std::list<Spilled> disk_;  // oldest spill first
  int64_t disk_bytes_ = 0;
  std::unordered_map<uint64_t, Where> where_;           // every held block by key
  std::unordered_multimap<uint64_t, uint64_t> after_;   // parent key -> keys of the held blocks after it
  // First blocks, found without a scan: by the hash of their tokens (per
  // length, for the chains that begin a prompt) and in token order (for the
  // longest partial agreement, which is a neighbour of the prompt's place).
  struct TokensLess {
    using is_transparent = void;
    static const std::vector<int32_t>& t(const BlockInfo* b) { return b->tokens; }
    static const std::vector<int32_t>& t(const std::vector<int32_t>& v) { return v; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const { return t(a) < t(b); }
  };
  std::multiset<const BlockInfo*, TokensLess> firsts_;
  std::unordered_multimap<uint64_t, uint64_t> first_by_tokens_;  // hash of a first block's tokens -> its key
  std::map<size_t, int64_t> first_lengths_;                      // token counts of first blocks -> how many
  PoolMetrics counts_;  // the counters (entries and bytes are computed)
};

}  // namespace anchorkv::serve
