#include "serve/block_store.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>

#include "runtime/prefix_chain.h"

namespace anchorkv::serve {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::BlockInfo;
using runtime::HeldBlock;

constexpr size_t kMaxLevels = 4096;     // blocks one lookup follows
constexpr size_t kMaxCandidates = 256;  // lengths tried after one block (the longest)
constexpr size_t kWriteBatch = 32;      // blocks per write pipeline

std::string hex(uint64_t x) {
  char s[20];
  std::snprintf(s, sizeof s, "%016" PRIx64, x);
  return s;
}

std::string_view bytes_view(const std::vector<uint8_t>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// The lengths a SMEMBERS reply names that fit in (0, room], ascending, the
// longest kMaxCandidates of them.
std::vector<size_t> lengths_in(const RedisReply& r, int64_t room) {
  std::vector<size_t> out;
  if (r.type != RedisReply::Type::kArray) return out;
  for (const RedisReply& item : r.items) {
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(item.str.data(), item.str.data() + item.str.size(), n);
    if (ec == std::errc() && end == item.str.data() + item.str.size() && n > 0 && n <= room)
      out.push_back(static_cast<size_t>(n));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.size() > kMaxCandidates) out.erase(out.begin(), out.end() - kMaxCandidates);
  return out;
}

// A lookup's replies: one value per block of a chain (together no larger
// than one block of the whole context), sets of lengths of a chain's blocks.
RedisLimits limits_of(const StoreOptions& o) {
  RedisLimits l;
  l.max_bulk = o.max_value;
  l.max_total = 2 * o.max_value;
  l.max_elements = size_t{1} << 16;
  return l;
}

RedisAddress address_of(const StoreOptions& o) {
  RedisAddress a = parse_redis_url(o.url);
  if (!o.password.empty()) a.password = o.password;
  return a;
}

}  // namespace

BlockStore::BlockStore(StoreOptions options, uint64_t root, Verify verify)
    : opt_(std::move(options)),
      limits_(limits_of(opt_)),
      address_(address_of(opt_)),
      prefix_("anchorkv:1:" + hex(root) + ":"),
      verify_(std::move(verify)) {
  try {
    idle_.push_back(std::make_unique<RedisConnection>(address_, opt_.timeout, limits_));
    up_ = true;
  } catch (const RedisUnavailable& e) {
    std::fprintf(stderr, "anchorkv serve: the kv store %s is down (%s); serving without it, retrying\n",
                 address_.redacted().c_str(), e.what());
  }
  writer_ = std::thread([this] { writer_loop(); });
}

BlockStore::~BlockStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

std::string BlockStore::block_key(uint64_t key) const { return prefix_ + "block:" + hex(key); }
std::string BlockStore::next_key(uint64_t parent) const { return prefix_ + "next:" + hex(parent); }

std::optional<std::vector<RedisReply>> BlockStore::run(const std::vector<RedisCommand>& commands,
                                                       Deadline deadline) {
  if (!up_) return std::nullopt;
  std::unique_ptr<RedisConnection> c;
  {
    std::lock_guard lock(conn_mu_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  try {
    if (!c) c = std::make_unique<RedisConnection>(address_, deadline, limits_);
    std::vector<RedisReply> replies = c->pipeline(commands, deadline);
    if (!c->broken()) {
      std::lock_guard lock(conn_mu_);
      idle_.push_back(std::move(c));
    }
    return replies;
  } catch (const RedisUnavailable& e) {
    mark_down(e.what());
    return std::nullopt;
  }
}

void BlockStore::drop_bad(const std::string& key, Deadline deadline) {
  run({{"DEL", key}}, deadline);
  std::lock_guard lock(mu_);
  ++counts_.bad_entries;
}

void BlockStore::mark_down(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    ++counts_.errors;
  }
  {
    std::lock_guard lock(conn_mu_);
    idle_.clear();
  }
  if (up_.exchange(false))
    std::fprintf(stderr, "anchorkv serve: the kv store %s is down (%s); serving without it, retrying\n",
                 address_.redacted().c_str(), why.c_str());
  wake_.notify_all();
}

void BlockStore::reconnect() {
  try {
    auto c = std::make_unique<RedisConnection>(address_, opt_.timeout, limits_);
    {
      std::lock_guard lock(conn_mu_);
      idle_.push_back(std::move(c));
    }
    up_ = true;
    std::fprintf(stderr, "anchorkv serve: the kv store %s is back\n", address_.redacted().c_str());
  } catch (const RedisUnavailable&) {
  }
}

// ---------------------------------------------------------------- lookups

std::vector<BlockInfo> BlockStore::walk(const std::vector<int32_t>& prompt, size_t max_tokens,
                                        uint64_t parent, int64_t first, Deadline deadline) {
  std::vector<BlockInfo> chain;
  const auto limit = static_cast<int64_t>(std::min(max_tokens, prompt.size()));
  std::optional<std::vector<RedisReply>> r = run({{"SMEMBERS", next_key(parent)}}, deadline);
  if (!r) return chain;
  RedisReply after = std::move((*r)[0]);  // the lengths of the blocks after `parent`
  if (after.type == RedisReply::Type::kTooLarge) drop_bad(next_key(parent), deadline);
  for (int64_t pos = first; chain.size() < kMaxLevels;) {
    const std::vector<size_t> lengths = lengths_in(after, limit - pos);
    if (lengths.empty()) break;
    const std::vector<uint64_t> keys = runtime::chain_keys(parent, prompt.data() + pos, lengths);
    // Each candidate's existence and the lengths after it, in one round trip.
    std::vector<std::string> words;
    words.reserve(2 * keys.size());
    std::vector<RedisCommand> cmds;
    for (uint64_t k : keys) {
      words.push_back(block_key(k));
      cmds.push_back({"EXISTS", words.back()});
      words.push_back(next_key(k));
      cmds.push_back({"SMEMBERS", words.back()});
    }
    r = run(cmds, deadline);
    if (!r) break;
    if (!r->empty() && r->back().type == RedisReply::Type::kTooLarge) {  // a set past the limits: deleted
      drop_bad(std::string(cmds[r->size() - 1][1]), deadline);
      break;
    }
    size_t pick = keys.size();
    for (size_t i = keys.size(); i-- > 0;)
      if ((*r)[2 * i].type == RedisReply::Type::kInteger && (*r)[2 * i].integer == 1) {
        pick = i;
        break;
      }
    if (pick == keys.size()) break;
    const auto end = pos + static_cast<int64_t>(lengths[pick]);
    chain.push_back(
        {keys[pick], parent, pos, std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + end)});
    parent = keys[pick];
    pos = end;
    after = std::move((*r)[2 * pick + 1]);
  }
  return chain;
}

std::vector<HeldBlock> BlockStore::extend(const std::vector<int32_t>& prompt, size_t max_tokens,
                                          uint64_t parent, int64_t first) {
  const auto t0 = Clock::now();
  const Deadline deadline = t0 + opt_.timeout;  // the lookup as a whole
  std::vector<HeldBlock> out;
  int64_t bad = 0, bytes = 0;
  const std::vector<BlockInfo> found =
      up_ ? walk(prompt, max_tokens, parent, first, deadline) : std::vector<BlockInfo>();
  if (!found.empty()) {
    std::vector<std::string> words;
    words.reserve(found.size());
    std::vector<RedisCommand> cmds;
    for (const BlockInfo& b : found) {
      words.push_back(block_key(b.key));
      cmds.push_back({"GET", words.back()});
    }
    const std::optional<std::vector<RedisReply>> r = run(cmds, deadline);
    for (size_t i = 0; r && i < r->size(); ++i) {
      const RedisReply& v = (*r)[i];
      if (v.type == RedisReply::Type::kTooLarge) {  // larger than any block of this model: refused unread
        ++bad;
        run({{"DEL", words[i]}}, deadline);
        break;
      }
      if (v.type != RedisReply::Type::kString) break;  // evicted since the walk
      auto file = std::make_shared<const std::vector<uint8_t>>(v.str.begin(), v.str.end());
      const std::optional<BlockInfo> info = verify_(file->data(), file->size());
      const BlockInfo& want = found[i];
      if (!info || info->key != want.key || info->parent != want.parent || info->first != want.first ||
          info->tokens != want.tokens) {
        ++bad;
        run({{"DEL", words[i]}}, deadline);
        break;
      }
      bytes += static_cast<int64_t>(file->size());
      out.push_back({*info, std::move(file)});
    }
  }
  std::lock_guard lock(mu_);
  ++counts_.lookups;
  ++(out.empty() ? counts_.misses : counts_.hits);
  counts_.blocks_read += static_cast<int64_t>(out.size());
  counts_.bytes_read += bytes;
  counts_.bad_entries += bad;
  counts_.lookup_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

void BlockStore::discard(uint64_t key) { drop_bad(block_key(key), Clock::now() + opt_.timeout); }

// ---------------------------------------------------------------- writes

void BlockStore::put(std::vector<HeldBlock> blocks, bool known_present) {
  {
    std::lock_guard lock(mu_);
    for (HeldBlock& b : blocks) {
      if (!up_ || queue_.size() >= opt_.queue) {
        counts_.dropped_writes += known_present ? 0 : 1;
        continue;
      }
      queue_.push_back({std::move(b), known_present});
    }
  }
  wake_.notify_all();
}

void BlockStore::flush(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  const auto done = [&] { return (queue_.empty() && !writing_) || stop_; };
  if (deadline == Clock::time_point::max()) return drained_.wait(lock, done);
  if (drained_.wait_until(lock, deadline, done)) return;
  for (const Pending& p : queue_) counts_.dropped_writes += p.check_first ? 0 : 1;
  queue_.clear();
}

void BlockStore::writer_loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!up_) {
      for (const Pending& p : queue_) counts_.dropped_writes += p.check_first ? 0 : 1;
      queue_.clear();
      drained_.notify_all();
      if (wake_.wait_for(lock, opt_.retry, [&] { return stop_; })) break;
      lock.unlock();
      reconnect();
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      drained_.notify_all();
      wake_.wait(lock, [&] { return stop_ || !queue_.empty() || !up_; });
      continue;
    }
    std::vector<Pending> batch;
    while (!queue_.empty() && batch.size() < kWriteBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    write(std::move(batch));
    lock.lock();
    writing_ = false;
  }
  drained_.notify_all();
}

// Outside mu_. Blocks marked check_first are written only when missing.
void BlockStore::write(std::vector<Pending> batch) {
  std::vector<std::string> words;
  words.reserve(4 * batch.size());  // the views below point into it: never reallocated
  std::vector<RedisCommand> checks;
  std::vector<size_t> checked;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].check_first) {
      words.push_back(block_key(batch[i].block.info.key));
      checks.push_back({"EXISTS", words.back()});
      checked.push_back(i);
    }
  std::vector<bool> skip(batch.size(), false);
  if (!checks.empty()) {
    const std::optional<std::vector<RedisReply>> r = run(checks);
    if (!r || r->size() < checks.size()) return;  // down or broken: these were not new blocks, nothing is lost
    for (size_t j = 0; j < checked.size(); ++j) skip[checked[j]] = (*r)[j].integer == 1;
  }
  const std::string ttl = std::to_string(opt_.ttl_s);
  std::vector<RedisCommand> cmds;
  std::vector<size_t> set_at(batch.size(), SIZE_MAX);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (skip[i]) continue;
    const HeldBlock& b = batch[i].block;
    words.push_back(block_key(b.info.key));
    set_at[i] = cmds.size();
    if (opt_.ttl_s > 0)
      cmds.push_back({"SET", words.back(), bytes_view(*b.file), "NX", "EX", ttl});
    else
      cmds.push_back({"SET", words.back(), bytes_view(*b.file), "NX"});
    words.push_back(next_key(b.info.parent));
    words.push_back(std::to_string(b.info.tokens.size()));
    cmds.push_back({"SADD", words[words.size() - 2], words.back()});
    if (opt_.ttl_s > 0) cmds.push_back({"EXPIRE", words[words.size() - 2], ttl});
  }
  std::optional<std::vector<RedisReply>> r;
  if (!cmds.empty()) {
    r = run(cmds);
    if (!r || r->size() < cmds.size()) {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < batch.size(); ++i) counts_.dropped_writes += set_at[i] != SIZE_MAX;
      return;
    }
  }
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const HeldBlock& b = batch[i].block;
    if (set_at[i] == SIZE_MAX) continue;
    const RedisReply& set = (*r)[set_at[i]];
    if (set.type == RedisReply::Type::kError) {  // e.g. OOM under a noeviction policy
      ++counts_.dropped_writes;
      continue;
    }
    if (set.type == RedisReply::Type::kString) {  // "OK"; nil: another replica wrote it first
      ++counts_.blocks_written;
      counts_.bytes_written += static_cast<int64_t>(b.file->size());
    }
  }
}

StoreMetrics BlockStore::metrics() const {
  std::lock_guard lock(mu_);
  StoreMetrics m = counts_;
  m.up = up_;
  return m;
}

}  // namespace anchorkv::serve
