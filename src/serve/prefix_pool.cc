#include "serve/prefix_pool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace anchorkv::serve {
namespace {

namespace fs = std::filesystem;
constexpr const char* kOp = "anchorkv serve";

// A temporary file the atomic writer left behind when the process was killed
// mid-write: ".block-KEY.akvc.tmp.XXXXXX" (".prefix-N..." from older servers).
bool leftover_temporary(const std::string& name) {
  return (name.rfind(".block-", 0) == 0 || name.rfind(".prefix-", 0) == 0) &&
         name.find(".akvc.tmp.") != std::string::npos;
}

// "block-KEY-SERIAL.akvc": each spill a file of its own, so removing the file
// of a block read back never removes a later spill of the same block.
std::string block_file(const std::string& folder, uint64_t key, uint64_t serial) {
  char name[64];
  std::snprintf(name, sizeof name, "block-%016" PRIx64 "-%" PRIx64 ".akvc", key, serial);
  return folder + "/" + name;
}

uint64_t tokens_hash(const int32_t* t, size_t n) { return XXH64(t, n * sizeof(int32_t), 0); }

}  // namespace

PrefixPool::PrefixPool(PoolOptions options, const Accept& accept)
    : opt_(std::move(options)),
      file_serial_(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count())) {
  if (!opt_.folder.empty()) index_folder(accept);
}

std::string PrefixPool::new_file(uint64_t key) { return block_file(opt_.folder, key, file_serial_++); }

void PrefixPool::index_folder(const Accept& accept) {
  std::error_code ec;
  fs::create_directories(opt_.folder, ec);
  if (ec || !fs::is_directory(opt_.folder, ec))
    core::fail(ErrorCode::kIo, kOp, "--cache-dir '" + opt_.folder + "' is not a folder that can be created");
  for (fs::directory_iterator it(opt_.folder, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    const std::string name = p.filename().string();
    if (leftover_temporary(name)) {
      fs::remove(p, ec);
      ec.clear();
      continue;
    }
    if (p.extension() != ".akvc" || !it->is_regular_file(ec)) continue;  // no FIFOs, devices, folders
    try {
      const core::MappedFile f = core::MappedFile::open(p.string(), kOp);
      std::optional<BlockInfo> info = accept(f.data(), f.size(), p.string());
      if (info && !find(info->key)) hold_on_disk({std::move(*info), p.string(), static_cast<int64_t>(f.size())});
    } catch (const Error&) {
      // Unreadable: left alone, as files of other models and caches are.
    }
  }
}

const BlockInfo* PrefixPool::find(uint64_t key) const {
  const auto it = where_.find(key);
  if (it == where_.end()) return nullptr;
  return it->second.tier == Tier::kDisk ? &it->second.disk->info : &it->second.memory->info;
}

bool PrefixPool::spilled_at(uint64_t key, const std::string& path) const {
  const auto it = where_.find(key);
  return it != where_.end() && it->second.tier == Tier::kDisk && it->second.disk->path == path;
}

void PrefixPool::index_first(const BlockInfo& info) {
  if (info.first != 0) return;
  firsts_.insert(&info);
  first_by_tokens_.emplace(tokens_hash(info.tokens.data(), info.tokens.size()), info.key);
  ++first_lengths_[info.tokens.size()];
}

void PrefixPool::unindex_first(const BlockInfo& info) {
  if (info.first != 0) return;
  for (auto [lo, hi] = firsts_.equal_range(&info); lo != hi; ++lo)
    if (*lo == &info) {
      firsts_.erase(lo);
      break;
    }
  for (auto [lo, hi] = first_by_tokens_.equal_range(tokens_hash(info.tokens.data(), info.tokens.size()));
       lo != hi; ++lo)
    if (lo->second == info.key) {
      first_by_tokens_.erase(lo);
      break;
    }
  if (--first_lengths_[info.tokens.size()] == 0) first_lengths_.erase(info.tokens.size());
}

void PrefixPool::hold_in_memory(Block block) {
  after_.emplace(block.info.parent, block.info.key);
  memory_bytes_ += static_cast<int64_t>(block.file->size());
  memory_.push_front(std::move(block));
  index_first(memory_.front().info);
  where_[memory_.front().info.key] = {Tier::kMemory, memory_.begin(), {}};
}

void PrefixPool::hold_on_disk(Spilled s) {
  after_.emplace(s.info.parent, s.info.key);
  disk_bytes_ += s.bytes;
  disk_.push_back(std::move(s));
  index_first(disk_.back().info);
  where_[disk_.back().info.key] = {Tier::kDisk, {}, std::prev(disk_.end())};
}

void PrefixPool::unhold(uint64_t key) {
  const auto w = where_.find(key);
  if (w == where_.end()) return;
  const BlockInfo& info = w->second.tier == Tier::kDisk ? w->second.disk->info : w->second.memory->info;
  unindex_first(info);
  const auto [lo, hi] = after_.equal_range(info.parent);
  for (auto it = lo; it != hi; ++it)
    if (it->second == key) {
      after_.erase(it);
      break;
    }
  switch (w->second.tier) {
    case Tier::kMemory:
      memory_bytes_ -= static_cast<int64_t>(w->second.memory->file->size());
      memory_.erase(w->second.memory);
      break;
    case Tier::kLeaving: leaving_.erase(w->second.memory); break;
    case Tier::kDisk:
      disk_bytes_ -= w->second.disk->bytes;
      disk_.erase(w->second.disk);
      break;
  }
  where_.erase(w);
}

template <typename Each>
void PrefixPool::each_child(uint64_t parent, Each&& each) const {
  const auto [lo, hi] = after_.equal_range(parent);
  for (auto it = lo; it != hi; ++it) each(*find(it->second));
}

// Depth first from every first block that matches: a block follows its
// parent when it starts where the parent ends and its tokens are the
// prompt's there. `visit(path)` sees every chain so found.
template <typename Visit>
void PrefixPool::walk_chains(const std::vector<int32_t>& prompt, Visit&& visit) const {
  std::vector<const BlockInfo*> path;
  auto down = [&](auto&& self, const BlockInfo* b) -> void {
    path.push_back(b);
    visit(path);
    each_child(b->key, [&](const BlockInfo& c) {
      if (c.first == b->end() && c.first > 0 && c.matches(prompt)) self(self, &c);
    });
    path.pop_back();
  };
  // First blocks of every length that fits: the hash of the prompt's
  // beginning of that length finds them (one pass over the prompt).
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  size_t hashed = 0;
  for (const auto& [length, n] : first_lengths_) {
    if (length > prompt.size()) break;
    XXH64_update(&state, prompt.data() + hashed, (length - hashed) * sizeof(int32_t));
    hashed = length;
    const auto [lo, hi] = first_by_tokens_.equal_range(XXH64_digest(&state));
    for (auto it = lo; it != hi; ++it)
      if (const BlockInfo* b = find(it->second); b->tokens.size() == length && b->matches(prompt)) down(down, b);
  }
}

std::vector<uint64_t> PrefixPool::find_chain(const std::vector<int32_t>& prompt, size_t max_tokens) const {
  std::vector<uint64_t> best;
  int64_t best_end = 0;
  walk_chains(prompt, [&](const std::vector<const BlockInfo*>& path) {
    const int64_t end = path.back()->end();
    if (end <= static_cast<int64_t>(max_tokens) && end > best_end) {
      best_end = end;
      best.clear();
      for (const BlockInfo* b : path) best.push_back(b->key);
    }
  });
  return best;
}

std::optional<std::vector<PrefixPool::Block>> PrefixPool::longest_chain(const std::vector<int32_t>& prompt,
                                                                        size_t max_tokens) {
  for (;;) {
    std::vector<Block> chain;        // in chain order; spilled links filled in below
    std::vector<size_t> spilled_at;  // which of them are in the folder
    std::vector<Spilled> spilled;
    {
      std::lock_guard lock(mu_);
      const std::vector<uint64_t> keys = find_chain(prompt, max_tokens);
      if (keys.empty()) {
        ++counts_.misses;
        return std::nullopt;
      }
      for (auto key = keys.rbegin(); key != keys.rend(); ++key) {  // the first block ends most recently used
        const Where& w = where_.at(*key);
        if (w.tier == Tier::kMemory) {
          memory_.splice(memory_.begin(), memory_, w.memory);  // iterators stay valid
          chain.push_back(memory_.front());
        } else if (w.tier == Tier::kLeaving) {
          chain.push_back(*w.memory);  // served from its bytes; it goes on to the folder
        } else {
          spilled_at.push_back(chain.size());
          spilled.push_back(*w.disk);
          chain.push_back({w.disk->info, nullptr});
        }
      }
    }
    // Spilled links are read outside the lock; the chain holds their bytes
    // whether or not memory keeps them (a chain longer than the budget still
    // comes back whole).
    bool unreadable = false;
    for (size_t i = 0; i < spilled.size() && !unreadable; ++i) {
      chain[spilled_at[i]].file = read_spilled(spilled[i]);
      unreadable = chain[spilled_at[i]].file == nullptr;
    }
    if (unreadable) continue;  // that file is dropped: look again for a shorter chain
    for (size_t i = 0; i < spilled.size(); ++i) keep_read_back(chain[spilled_at[i]], spilled[i].path);
    std::reverse(chain.begin(), chain.end());
    std::lock_guard lock(mu_);
    ++counts_.hits;
    return chain;
  }
}

// Outside mu_: a spilled file's bytes, or null when it cannot be read (then
// its entry is dropped, unless another request took it back meanwhile).
std::shared_ptr<const std::vector<uint8_t>> PrefixPool::read_spilled(const Spilled& s) {
  try {
    const core::MappedFile f = core::MappedFile::open(s.path, kOp);
    return std::make_shared<const std::vector<uint8_t>>(f.data(), f.data() + f.size());
  } catch (const Error&) {
    std::lock_guard lock(mu_);
    if (spilled_at(s.info.key, s.path)) {
      unhold(s.info.key);
      ++counts_.bad_entries;
    }
    return nullptr;
  }
}

// A block read back from the folder moves into memory in one step (it is
// findable throughout), unless another request already took it or it is
// larger than the budget (then it stays in the folder); its file is removed
// after, which can never be a later spill's (each has a file of its own).
void PrefixPool::keep_read_back(const Block& b, const std::string& path) {
  std::vector<Block> victims;
  {
    std::lock_guard lock(mu_);
    if (!spilled_at(b.info.key, path)) return;
    ++counts_.disk_hits;
    const auto size = static_cast<int64_t>(b.file->size());
    if (size > opt_.budget) return;
    unhold(b.info.key);
    victims = make_room(size);
    hold_in_memory(b);
  }
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) {
    std::lock_guard lock(mu_);
    ++counts_.disk_errors;
  }
  spill(std::move(victims));
}

int64_t PrefixPool::shared_prefix(const std::vector<int32_t>& prompt) const {
  std::lock_guard lock(mu_);
  // How far a block's tokens agree with the prompt's from its first position.
  auto agree = [&](const BlockInfo& b) {
    const auto n = std::min<int64_t>(static_cast<int64_t>(b.tokens.size()),
                                     std::max<int64_t>(0, static_cast<int64_t>(prompt.size()) - b.first));
    int64_t i = 0;
    while (i < n && b.tokens[static_cast<size_t>(i)] == prompt[static_cast<size_t>(b.first + i)]) ++i;
    return b.first + i;
  };
  int64_t best = 0;
  // First blocks that agree only in part: the longest agreement is with a
  // neighbour of the prompt's place in token order.
  const auto next = firsts_.lower_bound(prompt);
  if (next != firsts_.end()) best = std::max(best, agree(**next));
  if (next != firsts_.begin()) best = std::max(best, agree(**std::prev(next)));
  walk_chains(prompt, [&](const std::vector<const BlockInfo*>& path) {  // and the blocks after a matching chain
    const BlockInfo* b = path.back();
    best = std::max(best, b->end());
    each_child(b->key, [&](const BlockInfo& c) {
      if (c.first == b->end() && c.first > 0) best = std::max(best, agree(c));
    });
  });
  return best;
}

std::vector<PrefixPool::Block> PrefixPool::make_room(int64_t incoming) {
  std::vector<Block> victims;
  while (!memory_.empty() && memory_bytes_ + incoming > opt_.budget) {
    ++counts_.evictions;
    const uint64_t key = memory_.back().info.key;
    if (opt_.folder.empty()) {
      unhold(key);
      continue;
    }
    victims.push_back(memory_.back());
    memory_bytes_ -= static_cast<int64_t>(memory_.back().file->size());
    leaving_.splice(leaving_.end(), memory_, std::prev(memory_.end()));
    where_[key] = {Tier::kLeaving, std::prev(leaving_.end()), {}};
  }
  return victims;
}

bool PrefixPool::settle_on_disk(const Block& written, const std::string& path, Tier from) {
  const auto w = where_.find(written.info.key);
  if (w == where_.end() || w->second.tier != from || w->second.memory->file != written.file) return false;
  unhold(written.info.key);
  hold_on_disk({written.info, path, static_cast<int64_t>(written.file->size())});
  return true;
}

void PrefixPool::spill(std::vector<Block> victims) {
  for (Block& b : victims) {
    const std::string path = new_file(b.info.key);
    bool written = true;
    try {
      core::write_file_atomically(path, *b.file, kOp, kCacheFileMagic);
    } catch (const Error&) {  // a full or read-only folder: the block is dropped as without one
      written = false;
    }
    std::vector<std::string> files;
    {
      std::lock_guard lock(mu_);
      if (!written) {
        ++counts_.disk_errors;
        const auto w = where_.find(b.info.key);
        if (w != where_.end() && w->second.tier == Tier::kLeaving && w->second.memory->file == b.file)
          unhold(b.info.key);
        continue;
      }
      if (!settle_on_disk(b, path, Tier::kLeaving)) files.push_back(path);  // dropped meanwhile
      // Over the folder's budget, the oldest spilled blocks go, with the
      // blocks after them (no chain reaches those any more).
      while (opt_.disk_budget > 0 && disk_bytes_ > opt_.disk_budget && !disk_.empty())
        counts_.disk_evictions += drop_from(disk_.front().info.key, files);
    }
    remove_files(files);
  }
}

PoolPersisted PrefixPool::persist(std::chrono::steady_clock::time_point deadline) {
  PoolPersisted out;
  std::vector<Block> chosen;  // most recently used first, within the folder's budget
  {
    std::lock_guard lock(mu_);
    int64_t bytes = 0;
    for (const Block& b : memory_) {
      bytes += static_cast<int64_t>(b.file->size());
      if (opt_.folder.empty() || (opt_.disk_budget > 0 && bytes > opt_.disk_budget))
        ++out.left;
      else
        chosen.push_back(b);
    }
  }
  std::vector<std::pair<Block, std::string>> written;
  for (Block& b : chosen) {
    const std::string path = new_file(b.info.key);
    try {
      if (std::chrono::steady_clock::now() >= deadline) throw Error(ErrorCode::kIo, kOp, "past the deadline");
      core::write_file_atomically(path, *b.file, kOp, kCacheFileMagic);
    } catch (const Error&) {
      ++out.left;
      continue;
    }
    out.blocks += 1;
    out.bytes += static_cast<int64_t>(b.file->size());
    written.emplace_back(std::move(b), path);
  }
  std::vector<std::string> files;
  {
    std::lock_guard lock(mu_);
    // Least recently used first, so the most recently used are the newest spills.
    for (auto it = written.rbegin(); it != written.rend(); ++it)
      if (!settle_on_disk(it->first, it->second, Tier::kMemory)) files.push_back(it->second);  // moved meanwhile
    while (opt_.disk_budget > 0 && disk_bytes_ > opt_.disk_budget && !disk_.empty())
      counts_.disk_evictions += drop_from(disk_.front().info.key, files);
  }
  remove_files(files);
  return out;
}

void PrefixPool::add(Block block) {
  const auto bytes = static_cast<int64_t>(block.file->size());
  if (bytes > opt_.budget) return;
  std::vector<Block> victims;
  {
    std::lock_guard lock(mu_);
    if (const auto w = where_.find(block.info.key); w != where_.end()) {
      if (w->second.tier == Tier::kMemory) memory_.splice(memory_.begin(), memory_, w->second.memory);
      return;  // held already: its first bytes stay
    }
    victims = make_room(bytes);
    hold_in_memory(std::move(block));
  }
  spill(std::move(victims));
}

int64_t PrefixPool::drop_from(uint64_t key, std::vector<std::string>& files) {
  std::vector<uint64_t> gone{key};  // the block (held or not), then every held block after it
  std::unordered_set<uint64_t> seen{key};
  for (size_t i = 0; i < gone.size(); ++i)
    each_child(gone[i], [&](const BlockInfo& c) {
      if (c.first > 0 && seen.insert(c.key).second) gone.push_back(c.key);
    });
  int64_t dropped = 0;
  for (uint64_t k : gone) {
    const auto w = where_.find(k);
    if (w == where_.end()) continue;
    if (w->second.tier == Tier::kDisk) files.push_back(w->second.disk->path);
    unhold(k);
    ++dropped;
  }
  return dropped;
}

void PrefixPool::discard(uint64_t key) {
  std::vector<std::string> files;
  {
    std::lock_guard lock(mu_);
    ++counts_.bad_entries;
    drop_from(key, files);
  }
  remove_files(files);
}

void PrefixPool::remove_files(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    std::error_code ec;
    fs::remove(f, ec);
    if (ec) {
      std::lock_guard lock(mu_);
      ++counts_.disk_errors;
    }
  }
}

PoolMetrics PrefixPool::metrics() const {
  std::lock_guard lock(mu_);
  PoolMetrics m = counts_;
  m.entries = static_cast<int64_t>(memory_.size());
  m.bytes = memory_bytes_;
  m.disk_entries = static_cast<int64_t>(disk_.size());
  m.disk_bytes = disk_bytes_;
  return m;
}

}  // namespace anchorkv::serve
