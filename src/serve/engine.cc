#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/mapped_file.h"
#include "eval/prompt_cache.h"
#include "eval/tasks.h"

namespace anchorkv::serve {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Bytes at the end of s that start a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// A slot for the lifetime of one request.
class SlotGuard {
 public:
  SlotGuard(std::mutex& m, std::condition_variable& cv, int& busy, int slots) : m_(m), cv_(cv), busy_(busy) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return busy_ < slots; });
    ++busy_;
  }
  ~SlotGuard() {
    {
      std::lock_guard lock(m_);
      --busy_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex& m_;
  std::condition_variable& cv_;
  int& busy_;
};

}  // namespace

// ---------------------------------------------------------------- TextStream

std::string TextStream::push(const std::string& piece, bool* stopped) {
  pending_ += piece;
  size_t first = std::string::npos;
  for (const auto& s : stop_)
    if (!s.empty()) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that could still begin a stop string.
  size_t hold = 0;
  for (const auto& s : stop_)
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  hold = std::max(hold, incomplete_utf8_tail(pending_));
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string TextStream::finish() { return std::exchange(pending_, std::string()); }

// ---------------------------------------------------------------- Engine

TokenLogprob Engine::token_logprob(const std::vector<float>& logits, int32_t token, int top) const {
  const std::vector<double> lp = model::log_softmax(logits.data(), weights_.config.vocab);
  TokenLogprob t{tok_.piece(token), lp[static_cast<size_t>(token)], {}};
  std::vector<int32_t> ids(lp.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const auto k = std::min<size_t>(static_cast<size_t>(top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](int32_t a, int32_t b) { return lp[a] != lp[b] ? lp[a] > lp[b] : a < b; });
  for (size_t i = 0; i < k; ++i) t.top.emplace_back(tok_.piece(ids[i]), lp[static_cast<size_t>(ids[i])]);
  return t;
}

Engine::Engine(const model::LlamaWeights& weights, const model::Tokenizer& tokenizer, EngineOptions options)
    : weights_(weights), tok_(tokenizer), opt_(std::move(options)) {
  eval::make_model(weights_, opt_.cache, opt_.theta, 1);  // validates the cache spec now
  index_cache_dir();
}

// Under pool_mutex_: the pooled entry (memory first, then disk) with the
// longest token list that begins `prompt`.
bool Engine::take_prefix(const std::vector<int32_t>& prompt, PoolEntry* out) {
  std::lock_guard lock(pool_mutex_);
  auto begins = [&](const std::vector<int32_t>& t) {
    return t.size() <= prompt.size() && std::equal(t.begin(), t.end(), prompt.begin());
  };
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (begins(it->tokens) && (best == pool_.end() || it->tokens.size() > best->tokens.size())) best = it;
  size_t best_disk = disk_.size();
  for (size_t i = 0; i < disk_.size(); ++i)
    if (begins(disk_[i].tokens) && disk_[i].tokens.size() > (best == pool_.end() ? 0 : best->tokens.size()) &&
        (best_disk == disk_.size() || disk_[i].tokens.size() > disk_[best_disk].tokens.size()))
      best_disk = i;
  if (best_disk < disk_.size()) {  // back into memory
    const DiskEntry d = disk_[best_disk];
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(best_disk));
    try {
      const core::MappedFile f = core::MappedFile::open(d.path, "anchorkv serve");
      PoolEntry e{d.tokens, std::vector<uint8_t>(f.data(), f.data() + f.size())};
      std::filesystem::remove(d.path);
      ++metrics_.disk_hits;
      *out = e;
      pool_bytes_ += static_cast<int64_t>(e.file.size());
      pool_.push_front(std::move(e));
      while (pool_bytes_ > opt_.pool_budget && pool_.size() > 1) evict_one();
      ++metrics_.prefix_hits;
      return true;
    } catch (const Error&) {
      // A spilled file that went away or cannot be read is simply not a hit.
    }
  }
  if (best == pool_.end()) {
    ++metrics_.prefix_misses;
    return false;
  }
  pool_.splice(pool_.begin(), pool_, best);  // most recently used
  *out = pool_.front();
  ++metrics_.prefix_hits;
  return true;
}

int64_t Engine::shared_prefix(const std::vector<int32_t>& prompt) const {
  std::lock_guard lock(pool_mutex_);
  size_t best = 0;
  auto consider = [&](const std::vector<int32_t>& t) {
    const size_t n = std::min(t.size(), prompt.size());
    size_t i = 0;
    while (i < n && t[i] == prompt[i]) ++i;
    best = std::max(best, i);
  };
  for (const auto& e : pool_) consider(e.tokens);
  for (const auto& d : disk_) consider(d.tokens);
  return static_cast<int64_t>(best);
}

void Engine::evict_one() {
  PoolEntry& e = pool_.back();
  const auto bytes = static_cast<int64_t>(e.file.size());
  if (!opt_.cache_dir.empty()) {
    const std::string path = opt_.cache_dir + "/prefix-" + std::to_string(next_file_++) + ".akvc";
    try {
      core::write_file_atomically(path, e.file, "anchorkv serve");
      disk_.push_back({std::move(e.tokens), path, bytes});
    } catch (const Error&) {
      // A full or read-only folder: the entry is dropped as without --cache-dir.
    }
  }
  pool_bytes_ -= bytes;
  pool_.pop_back();
  ++metrics_.pool_evictions;
}

void Engine::add_to_pool(PoolEntry entry) {
  const auto bytes = static_cast<int64_t>(entry.file.size());
  std::lock_guard lock(pool_mutex_);
  if (bytes > opt_.pool_budget) return;
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->tokens == entry.tokens) {  // the same prompt again: refresh it
      pool_bytes_ -= static_cast<int64_t>(it->file.size());
      pool_.erase(it);
      break;
    }
  while (!pool_.empty() && pool_bytes_ + bytes > opt_.pool_budget) evict_one();
  pool_bytes_ += bytes;
  pool_.push_front(std::move(entry));
}

// Spilled files of an earlier run with the same model and cache become disk entries.
void Engine::index_cache_dir() {
  if (opt_.cache_dir.empty()) return;
  std::filesystem::create_directories(opt_.cache_dir);
  for (const auto& f : std::filesystem::directory_iterator(opt_.cache_dir)) {
    if (f.path().extension() != ".akvc") continue;
    try {
      const LoadedCaches l = load_caches(f.path().string());
      if (eval::key_mismatch(l.meta.entries, key()).empty() && !l.meta.tokens.empty())
        disk_.push_back({l.meta.tokens, f.path().string(), static_cast<int64_t>(f.file_size())});
    } catch (const Error&) {
      // Not ours or damaged: left alone.
    }
    const std::string stem = f.path().stem().string();
    if (stem.rfind("prefix-", 0) == 0) next_file_ = std::max<int64_t>(next_file_, std::atoll(stem.c_str() + 7) + 1);
  }
}

GenerateResult Engine::generate(const GenerateRequest& req) {
  SlotGuard slot(slot_mutex_, slot_free_, busy_slots_, std::max(1, opt_.slots));
  GenerateResult res;
  res.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  model::LlamaModel m = eval::make_model(weights_, opt_.cache, opt_.theta, opt_.threads);
  std::vector<float> logits;
  PoolEntry hit;
  if (take_prefix(req.prompt, &hit)) {
    LoadedCaches l = load_caches_from_memory(hit.file.data(), hit.file.size(), "prefix pool");
    m.restore(std::move(l.caches), static_cast<int64_t>(hit.tokens.size()));
    res.reused_tokens = static_cast<int64_t>(hit.tokens.size());
    logits = std::move(l.meta.logits);
  }
  auto t0 = Clock::now();
  auto prefill_to = [&](int64_t end) {
    logits = m.forward(std::vector<int32_t>(req.prompt.begin() + m.position(), req.prompt.begin() + end));
    if (end < opt_.min_prefix) return;
    std::vector<int32_t> tokens(req.prompt.begin(), req.prompt.begin() + end);
    std::vector<uint8_t> file = eval::prompt_file(key(), m, tokens, logits);
    add_to_pool({std::move(tokens), std::move(file)});
  };
  if (res.reused_tokens < res.prompt_tokens) {
    // A prompt that shares a longer beginning with a pooled one than what was
    // restored (another question about the same document) first prefills up
    // to that point and pools it, so the next such prompt restores it.
    const int64_t shared = shared_prefix(req.prompt);
    if (shared > res.reused_tokens && shared < res.prompt_tokens && shared >= opt_.min_prefix) prefill_to(shared);
    prefill_to(res.prompt_tokens);
  }
  res.prefill_s = since(t0);
  t0 = Clock::now();
  model::Sampler sampler(req.sampler);
  TextStream stream(req.stop);
  res.finish_reason = "length";
  auto emit = [&](const std::string& text) {
    res.text += text;
    return text.empty() || !req.on_text || req.on_text(text);
  };
  bool stop_string = false;
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), weights_.config.vocab);
    if (next == tok_.eos()) {
      res.finish_reason = "stop";
      break;
    }
    ++res.completion_tokens;
    if (req.top_logprobs >= 0) res.logprobs.push_back(token_logprob(logits, next, req.top_logprobs));
    if (!emit(stream.push(tok_.piece(next), &stop_string))) {
      res.finish_reason = "cancelled";
      break;
    }
    if (stop_string) {
      res.finish_reason = "stop";
      break;
    }
    if (m.position() >= weights_.config.context && weights_.config.context > 0) break;
    if (i + 1 < req.max_tokens) logits = m.forward({next});
  }
  if (res.finish_reason != "cancelled" && !stop_string && !emit(stream.finish())) res.finish_reason = "cancelled";
  res.decode_s = since(t0);
  std::lock_guard lock(pool_mutex_);
  metrics_.requests += 1;
  metrics_.prompt_tokens += res.prompt_tokens;
  metrics_.prefilled_tokens += res.prompt_tokens - res.reused_tokens;
  metrics_.completion_tokens += res.completion_tokens;
  metrics_.prefill_s += res.prefill_s;
  metrics_.decode_s += res.decode_s;
  return res;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(pool_mutex_);
  EngineMetrics m = metrics_;
  m.pool_entries = static_cast<int64_t>(pool_.size());
  m.pool_bytes = pool_bytes_;
  m.disk_entries = static_cast<int64_t>(disk_.size());
  for (const auto& d : disk_) m.disk_bytes += d.bytes;
  return m;
}

}  // namespace anchorkv::serve
