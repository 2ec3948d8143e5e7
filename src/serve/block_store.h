// The tier of prefix blocks shared by server replicas: a Redis-protocol
// server (redis_client.h) below each replica's own pool (prefix_pool.h).
//
// Keys, under a namespace of the format version and the chain root (which
// hashes the model identity, its tensor bytes included, the cache spec and
// theta; runtime/prefix_chain.h):
//   anchorkv:1:<root>:block:<key>   a block's file bytes (docs/cachefile.md,
//                                   "Prefix blocks"): written once (SET NX),
//                                   never changed, optionally with a TTL
//   anchorkv:1:<root>:next:<parent> the set of the lengths of the blocks
//                                   after <parent> (SADD: adding twice is
//                                   harmless, so replicas need no locks)
// A lookup walks from where the caller's chain ends: it reads the lengths
// after the current block, computes from the prompt the key each length
// would have, checks them in one pipeline, follows the longest that exists,
// and at the end fetches the blocks it found in one pipeline. Every value is
// verified (the caller's `verify` reads its header: model, cache, key,
// checksum; then its place and its tokens against the prompt) before it is
// returned; a bad one is a miss, deleted and counted.
//
// Every round trip, and a lookup as a whole, ends by `timeout`; a value
// larger than `max_value` (or a set of more lengths than any chain has) is
// refused unread, counted as a bad entry and deleted.
//
// Failures are misses: any error (refused, timed out, a broken reply) marks
// the store down, and while it is down lookups and writes return at once
// (writes are dropped and counted); a background thread reconnects every
// `retry` and marks it up again. Writes go through a bounded queue and that
// thread, off the requests' path.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/block_info.h"
#include "serve/redis_client.h"

namespace anchorkv::serve {

struct StoreOptions {
  std::string url;                         // parse_redis_url
  std::string password;                    // when set, instead of the URL's
  std::chrono::milliseconds timeout{250};  // connecting, every round trip, and a lookup as a whole
  size_t max_value = size_t{64} << 20;     // the largest block (runtime::max_block_bytes): larger values are bad
  std::chrono::milliseconds retry{1000};   // between reconnection attempts of a down store
  int64_t ttl_s = 0;                       // 0: entries stay until the store evicts them
  size_t queue = 256;                      // blocks waiting to be written; more are dropped
};

struct StoreMetrics {
  bool up = false;
  int64_t lookups = 0, hits = 0, misses = 0;  // hits: lookups that returned blocks
  int64_t blocks_read = 0, bytes_read = 0;
  int64_t blocks_written = 0, bytes_written = 0;
  int64_t errors = 0;          // failed round trips (each marks the store down)
  int64_t dropped_writes = 0;  // blocks not written: queue full or store down
  int64_t bad_entries = 0;     // values found damaged, foreign or misplaced, and deleted
  double lookup_seconds = 0;   // time in lookups, all of them
};

class BlockStore {
 public:
  // What a value's bytes say they are, when they are a block of this
  // server's model and cache with a consistent key; nothing otherwise.
  using Verify = std::function<std::optional<runtime::BlockInfo>(const uint8_t*, size_t)>;
  // Connects at once; an unreachable store starts down (and is retried).
  BlockStore(StoreOptions options, uint64_t root, Verify verify);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // The blocks after `parent` (the chain root when `first` is 0) that
  // continue `prompt` from position `first` and end at most `max_tokens`
  // into it, first first; each verified. Empty on a miss or a down store.
  std::vector<runtime::HeldBlock> extend(const std::vector<int32_t>& prompt, size_t max_tokens,
                                         uint64_t parent, int64_t first);
  // Queues blocks to write. `known_present`: blocks the store probably has
  // already (restored from the replica's own pool): written only when a
  // check finds them missing (the store evicted them, or was down when they
  // were made); one EXISTS each, in the background.
  void put(std::vector<runtime::HeldBlock> blocks, bool known_present = false);
  // Deletes a block found bad after extend() returned it.
  void discard(uint64_t key);
  // Waits until every queued write is done or dropped (tests, shutdown),
  // or until `deadline`: then what is still queued is dropped (counted).
  void flush(std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  StoreMetrics metrics() const;
  bool up() const { return up_.load(); }
  std::string address() const { return address_.redacted(); }

 private:
  struct Pending {
    runtime::HeldBlock block;
    bool check_first = false;
  };
  std::string block_key(uint64_t key) const;
  std::string next_key(uint64_t parent) const;
  // One pipeline on an idle or new connection, done by `deadline`; nothing
  // when the store is down or fails (then it is marked down). A reply past
  // the limits ends the replies as kTooLarge (not a failure).
  using Deadline = std::chrono::steady_clock::time_point;
  std::optional<std::vector<RedisReply>> run(const std::vector<RedisCommand>& commands, Deadline deadline);
  std::optional<std::vector<RedisReply>> run(const std::vector<RedisCommand>& commands) {
    return run(commands, std::chrono::steady_clock::now() + opt_.timeout);
  }
  // Deletes a value found bad (by `deadline`) and counts it.
  void drop_bad(const std::string& key, Deadline deadline);
  void mark_down(const std::string& why);
  void writer_loop();
  void write(std::vector<Pending> batch);
  void reconnect();
  // The keys of the longest chain of stored blocks continuing `prompt`.
  std::vector<runtime::BlockInfo> walk(const std::vector<int32_t>& prompt, size_t max_tokens, uint64_t parent,
                                       int64_t first, Deadline deadline);

  const StoreOptions opt_;
  const RedisLimits limits_;
  const RedisAddress address_;
  const std::string prefix_;  // "anchorkv:1:<root>:"
  const Verify verify_;
  std::atomic<bool> up_{false};

  std::mutex conn_mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;

  mutable std::mutex mu_;  // the queue and the counters
  std::condition_variable wake_, drained_;
  std::deque<Pending> queue_;
  bool writing_ = false, stop_ = false;
  StoreMetrics counts_;
  std::thread writer_;
};

}  // namespace anchorkv::serve
