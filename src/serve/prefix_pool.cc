#include "serve/prefix_pool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <unordered_map>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

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

std::string block_file(const std::string& folder, uint64_t key) {
  char name[40];
  std::snprintf(name, sizeof name, "block-%016" PRIx64 ".akvc", key);
  return folder + "/" + name;
}

}  // namespace

PrefixPool::PrefixPool(PoolOptions options, const Accept& accept) : opt_(std::move(options)) {
  if (!opt_.folder.empty()) index_folder(accept);
}

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
      if (info && !find(info->key)) {
        disk_.push_back({std::move(*info), p.string(), static_cast<int64_t>(f.size())});
        disk_bytes_ += disk_.back().bytes;
      }
    } catch (const Error&) {
      // Unreadable: left alone, as files of other models and caches are.
    }
  }
}

const BlockInfo* PrefixPool::find(uint64_t key) const {
  for (const Block& b : memory_)
    if (b.info.key == key) return &b.info;
  for (const Spilled& s : disk_)
    if (s.info.key == key) return &s.info;
  return nullptr;
}

std::unordered_multimap<uint64_t, const BlockInfo*> PrefixPool::children() const {
  std::unordered_multimap<uint64_t, const BlockInfo*> out;
  out.reserve(memory_.size() + disk_.size());
  for (const Block& b : memory_)
    if (b.info.first > 0) out.emplace(b.info.parent, &b.info);
  for (const Spilled& s : disk_)
    if (s.info.first > 0) out.emplace(s.info.parent, &s.info);
  return out;
}

// Depth first from every first block that matches: a block follows its
// parent when it starts where the parent ends and its tokens are the
// prompt's there. `visit(path)` sees every chain so found.
template <typename Visit>
void PrefixPool::walk_chains(const std::vector<int32_t>& prompt, Visit&& visit) const {
  const auto after = children();
  std::vector<const BlockInfo*> path;
  auto down = [&](auto&& self, const BlockInfo* b) -> void {
    path.push_back(b);
    visit(path);
    const auto [lo, hi] = after.equal_range(b->key);
    for (auto it = lo; it != hi; ++it)
      if (it->second->first == b->end() && it->second->matches(prompt)) self(self, it->second);
    path.pop_back();
  };
  auto start = [&](const BlockInfo& b) {
    if (b.first == 0 && b.matches(prompt)) down(down, &b);
  };
  for (const Block& b : memory_) start(b.info);
  for (const Spilled& s : disk_) start(s.info);
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
        auto it =
            std::find_if(memory_.begin(), memory_.end(), [&](const Block& b) { return b.info.key == *key; });
        if (it != memory_.end()) {
          memory_.splice(memory_.begin(), memory_, it);
          chain.push_back(memory_.front());
        } else {
          const auto d =
              std::find_if(disk_.begin(), disk_.end(), [&](const Spilled& s) { return s.info.key == *key; });
          spilled_at.push_back(chain.size());
          spilled.push_back(*d);
          chain.push_back({d->info, nullptr});
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
    const auto n = std::erase_if(disk_, [&](const Spilled& d) {
      if (d.info.key != s.info.key || d.path != s.path) return false;
      disk_bytes_ -= d.bytes;
      return true;
    });
    if (n > 0) ++counts_.bad_entries;
    return nullptr;
  }
}

// A block read back from the folder moves into memory, unless another
// request already took it. Its file goes first, so that a later spill of the
// same block (to the same path) is never removed by this one.
void PrefixPool::keep_read_back(const Block& b, const std::string& path) {
  {
    std::lock_guard lock(mu_);
    const auto n = std::erase_if(disk_, [&](const Spilled& d) {
      if (d.info.key != b.info.key || d.path != path) return false;
      disk_bytes_ -= d.bytes;
      return true;
    });
    if (n == 0) return;
    ++counts_.disk_hits;
  }
  std::error_code ec;
  fs::remove(path, ec);
  std::vector<Block> victims;
  {
    std::lock_guard lock(mu_);
    if (ec) ++counts_.disk_errors;
    const auto size = static_cast<int64_t>(b.file->size());
    if (size > opt_.budget || find(b.info.key)) return;  // too big to hold, or added again meanwhile
    victims = make_room(size);
    memory_bytes_ += size;
    memory_.push_front(b);
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
  for (const Block& b : memory_)  // first blocks that agree only in part
    if (b.info.first == 0) best = std::max(best, agree(b.info));
  for (const Spilled& s : disk_)
    if (s.info.first == 0) best = std::max(best, agree(s.info));
  const auto after = children();
  walk_chains(prompt, [&](const std::vector<const BlockInfo*>& path) {  // and the blocks after a matching chain
    const BlockInfo* b = path.back();
    best = std::max(best, b->end());
    const auto [lo, hi] = after.equal_range(b->key);
    for (auto it = lo; it != hi; ++it)
      if (it->second->first == b->end()) best = std::max(best, agree(*it->second));
  });
  return best;
}

std::vector<PrefixPool::Block> PrefixPool::make_room(int64_t incoming) {
  std::vector<Block> victims;
  while (!memory_.empty() && memory_bytes_ + incoming > opt_.budget) {
    memory_bytes_ -= static_cast<int64_t>(memory_.back().file->size());
    victims.push_back(std::move(memory_.back()));
    memory_.pop_back();
    ++counts_.evictions;
  }
  return victims;
}

void PrefixPool::spill(std::vector<Block> victims) {
  if (opt_.folder.empty()) return;
  for (Block& b : victims) {
    const std::string path = block_file(opt_.folder, b.info.key);
    try {
      core::write_file_atomically(path, *b.file, kOp, kCacheFileMagic);
    } catch (const Error&) {  // a full or read-only folder: the block is dropped as without one
      std::lock_guard lock(mu_);
      ++counts_.disk_errors;
      continue;
    }
    std::vector<std::string> files;
    {
      std::lock_guard lock(mu_);
      if (find(b.info.key)) continue;  // added again meanwhile: that one is held (and spilled to the same path)
      disk_.push_back({std::move(b.info), path, static_cast<int64_t>(b.file->size())});
      disk_bytes_ += disk_.back().bytes;
      // Over the folder's budget, the oldest spilled blocks go, with the
      // blocks after them (no chain reaches those any more).
      while (opt_.disk_budget > 0 && disk_bytes_ > opt_.disk_budget && !disk_.empty())
        counts_.disk_evictions += drop_from(disk_.front().info.key, files);
    }
    remove_files(files);
  }
}

void PrefixPool::add(Block block) {
  const auto bytes = static_cast<int64_t>(block.file->size());
  if (bytes > opt_.budget) return;
  std::vector<Block> victims;
  {
    std::lock_guard lock(mu_);
    for (auto it = memory_.begin(); it != memory_.end(); ++it)
      if (it->info.key == block.info.key) {  // the same block again: refresh it
        memory_bytes_ -= static_cast<int64_t>(it->file->size());
        memory_.erase(it);
        break;
      }
    std::erase_if(disk_, [&](const Spilled& s) {  // its file: overwritten when it is spilled again
      if (s.info.key != block.info.key) return false;
      disk_bytes_ -= s.bytes;
      return true;
    });
    victims = make_room(bytes);
    memory_bytes_ += bytes;
    memory_.push_front(std::move(block));
  }
  spill(std::move(victims));
}

int64_t PrefixPool::drop_from(uint64_t key, std::vector<std::string>& files) {
  std::vector<uint64_t> gone{key};  // the block, then every block after it
  auto after_gone = [&](const BlockInfo& b) {
    return std::find(gone.begin(), gone.end(), b.key) != gone.end() ||
           (b.first > 0 && std::find(gone.begin(), gone.end(), b.parent) != gone.end());
  };
  int64_t dropped = 0;
  for (bool more = true; more;) {
    more = false;
    for (auto it = memory_.begin(); it != memory_.end();)
      if (after_gone(it->info)) {
        if (std::find(gone.begin(), gone.end(), it->info.key) == gone.end()) gone.push_back(it->info.key);
        memory_bytes_ -= static_cast<int64_t>(it->file->size());
        it = memory_.erase(it);
        more = true;
        ++dropped;
      } else {
        ++it;
      }
    for (auto it = disk_.begin(); it != disk_.end();)
      if (after_gone(it->info)) {
        if (std::find(gone.begin(), gone.end(), it->info.key) == gone.end()) gone.push_back(it->info.key);
        files.push_back(it->path);
        disk_bytes_ -= it->bytes;
        it = disk_.erase(it);
        more = true;
        ++dropped;
      } else {
        ++it;
      }
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
