#include "serve/prefix_pool.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace anchorkv::serve {
namespace {

namespace fs = std::filesystem;
constexpr const char* kOp = "anchorkv serve";

bool begins(const std::vector<int32_t>& t, const std::vector<int32_t>& prompt) {
  return t.size() <= prompt.size() && std::equal(t.begin(), t.end(), prompt.begin());
}

// A temporary file the atomic writer left behind when the process was killed
// mid-write: ".prefix-N.akvc.tmp.XXXXXX".
bool leftover_temporary(const std::string& name) {
  return name.rfind(".prefix-", 0) == 0 && name.find(".akvc.tmp.") != std::string::npos;
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
      if (std::optional<std::vector<int32_t>> tokens = accept(f.data(), f.size(), p.string()))
        disk_.push_back({std::move(*tokens), p.string(), static_cast<int64_t>(f.size())});
    } catch (const Error&) {
      // Unreadable: left alone, as files of other models and caches are.
    }
    const std::string stem = p.stem().string();
    if (stem.rfind("prefix-", 0) == 0) next_file_ = std::max<int64_t>(next_file_, std::atoll(stem.c_str() + 7) + 1);
  }
}

std::optional<PrefixPool::Entry> PrefixPool::longest_prefix(const std::vector<int32_t>& prompt, size_t max_tokens) {
  for (;;) {
    std::unique_lock lock(mu_);
    auto fits = [&](const std::vector<int32_t>& t) { return t.size() <= max_tokens && begins(t, prompt); };
    auto best = memory_.end();
    for (auto it = memory_.begin(); it != memory_.end(); ++it)
      if (fits(it->tokens) && (best == memory_.end() || it->tokens.size() > best->tokens.size())) best = it;
    const size_t have = best == memory_.end() ? 0 : best->tokens.size();
    auto disk = disk_.end();
    for (auto it = disk_.begin(); it != disk_.end(); ++it)
      if (fits(it->tokens) && it->tokens.size() > have && (disk == disk_.end() || it->tokens.size() > disk->tokens.size()))
        disk = it;
    if (disk != disk_.end()) {
      Spilled s = std::move(*disk);
      disk_.erase(disk);
      lock.unlock();
      if (std::optional<Entry> e = read_back(std::move(s))) return e;
      continue;  // unreadable: dropped; look again
    }
    if (best == memory_.end()) {
      ++counts_.misses;
      return std::nullopt;
    }
    memory_.splice(memory_.begin(), memory_, best);  // most recently used
    ++counts_.hits;
    return memory_.front();
  }
}

// Outside mu_: the spilled file's bytes, back into memory.
std::optional<PrefixPool::Entry> PrefixPool::read_back(Spilled s) {
  std::error_code ec;
  Entry e;
  try {
    const core::MappedFile f = core::MappedFile::open(s.path, kOp);
    e = {std::move(s.tokens), std::make_shared<const std::vector<uint8_t>>(f.data(), f.data() + f.size())};
  } catch (const Error&) {
    std::lock_guard lock(mu_);
    ++counts_.bad_entries;
    return std::nullopt;
  }
  fs::remove(s.path, ec);
  std::vector<Entry> victims;
  {
    std::lock_guard lock(mu_);
    if (ec) ++counts_.disk_errors;
    ++counts_.disk_hits;
    ++counts_.hits;
    victims = make_room(static_cast<int64_t>(e.file->size()));
    memory_bytes_ += static_cast<int64_t>(e.file->size());
    memory_.push_front(e);
  }
  spill(std::move(victims));
  return e;
}

int64_t PrefixPool::shared_prefix(const std::vector<int32_t>& prompt) const {
  std::lock_guard lock(mu_);
  size_t best = 0;
  auto consider = [&](const std::vector<int32_t>& t) {
    const size_t n = std::min(t.size(), prompt.size());
    size_t i = 0;
    while (i < n && t[i] == prompt[i]) ++i;
    best = std::max(best, i);
  };
  for (const auto& e : memory_) consider(e.tokens);
  for (const auto& d : disk_) consider(d.tokens);
  return static_cast<int64_t>(best);
}

std::vector<PrefixPool::Entry> PrefixPool::make_room(int64_t incoming) {
  std::vector<Entry> victims;
  while (!memory_.empty() && memory_bytes_ + incoming > opt_.budget) {
    memory_bytes_ -= static_cast<int64_t>(memory_.back().file->size());
    victims.push_back(std::move(memory_.back()));
    memory_.pop_back();
    ++counts_.evictions;
  }
  return victims;
}

void PrefixPool::spill(std::vector<Entry> victims) {
  if (opt_.folder.empty()) return;
  for (Entry& e : victims) {
    std::string path;
    {
      std::lock_guard lock(mu_);
      path = opt_.folder + "/prefix-" + std::to_string(next_file_++) + ".akvc";
    }
    try {
      core::write_file_atomically(path, *e.file, kOp, kCacheFileMagic);
    } catch (const Error&) {  // a full or read-only folder: the entry is dropped as without one
      std::lock_guard lock(mu_);
      ++counts_.disk_errors;
      continue;
    }
    std::lock_guard lock(mu_);
    disk_.push_back({std::move(e.tokens), path, static_cast<int64_t>(e.file->size())});
  }
}

void PrefixPool::add(std::vector<int32_t> tokens, std::vector<uint8_t> file) {
  const auto bytes = static_cast<int64_t>(file.size());
  if (bytes > opt_.budget) return;
  Entry entry{std::move(tokens), std::make_shared<const std::vector<uint8_t>>(std::move(file))};
  std::vector<Entry> victims;
  {
    std::lock_guard lock(mu_);
    for (auto it = memory_.begin(); it != memory_.end(); ++it)
      if (it->tokens == entry.tokens) {  // the same prompt again: refresh it
        memory_bytes_ -= static_cast<int64_t>(it->file->size());
        memory_.erase(it);
        break;
      }
    victims = make_room(bytes);
    memory_bytes_ += bytes;
    memory_.push_front(std::move(entry));
  }
  spill(std::move(victims));
}

void PrefixPool::discard(const std::vector<int32_t>& tokens) {
  std::vector<std::string> files;
  {
    std::lock_guard lock(mu_);
    ++counts_.bad_entries;
    for (auto it = memory_.begin(); it != memory_.end();)
      if (it->tokens == tokens) {
        memory_bytes_ -= static_cast<int64_t>(it->file->size());
        it = memory_.erase(it);
      } else {
        ++it;
      }
    for (auto it = disk_.begin(); it != disk_.end();)
      if (it->tokens == tokens) {
        files.push_back(it->path);
        it = disk_.erase(it);
      } else {
        ++it;
      }
  }
  for (const std::string& f : files) {
    std::error_code ec;
    fs::remove(f, ec);
  }
}

PoolMetrics PrefixPool::metrics() const {
  std::lock_guard lock(mu_);
  PoolMetrics m = counts_;
  m.entries = static_cast<int64_t>(memory_.size());
  m.bytes = memory_bytes_;
  m.disk_entries = static_cast<int64_t>(disk_.size());
  for (const auto& d : disk_) m.disk_bytes += d.bytes;
  return m;
}

}  // namespace anchorkv::serve
