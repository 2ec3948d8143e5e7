#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "runtime/prompt_cache.h"
#include "runtime/session.h"

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

// A slot for the lifetime of one request whose place in the queue is
// already counted in `waiting`. Waits while every slot is busy (checking
// `keep_going` every 100 ms).
class SlotGuard {
 public:
  SlotGuard(std::mutex& m, std::condition_variable& cv, int& busy, int& waiting, int slots,
            const std::function<bool()>& keep_going)
      : m_(m), cv_(cv), busy_(busy) {
    std::unique_lock lock(m_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return busy_ < slots; }))
      if (keep_going && !keep_going()) {
        --waiting;
        cancelled = true;
        return;
      }
    --waiting;
    ++busy_;
    held_ = true;
  }
  ~SlotGuard() {
    if (!held_) return;
    {
      std::lock_guard lock(m_);
      --busy_;
    }
    cv_.notify_one();
  }
  bool cancelled = false;

 private:
  std::mutex& m_;
  std::condition_variable& cv_;
  int& busy_;
  bool held_ = false;
};

}  // namespace

// ---------------------------------------------------------------- TextStream

TextStream::TextStream(std::vector<std::string> stop) {
  for (std::string& text : stop) {
    if (text.empty()) continue;
    Matcher m{std::move(text), {}, 0};
    m.fallback.assign(m.text.size(), 0);
    for (size_t i = 1, k = 0; i < m.text.size(); ++i) {
      while (k > 0 && m.text[i] != m.text[k]) k = m.fallback[k - 1];
      if (m.text[i] == m.text[k]) ++k;
      m.fallback[i] = static_cast<uint32_t>(k);
    }
    stop_.push_back(std::move(m));
  }
}

std::string TextStream::push(const std::string& piece, bool* stopped) {
  const size_t base = pending_.size();
  pending_ += piece;
  size_t first = std::string::npos;  // where the earliest complete stop string starts
  for (Matcher& m : stop_) {
    for (size_t i = 0; i < piece.size(); ++i) {
      while (m.matched > 0 && piece[i] != m.text[m.matched]) m.matched = m.fallback[m.matched - 1];
      if (piece[i] == m.text[m.matched]) ++m.matched;
      if (m.matched == m.text.size()) {
        first = std::min(first, base + i + 1 - m.text.size());
        break;
      }
    }
  }
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that could still begin a stop string.
  size_t hold = incomplete_utf8_tail(pending_);
  for (const Matcher& m : stop_) hold = std::max(hold, m.matched);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string TextStream::finish() { return std::exchange(pending_, std::string()); }

// ---------------------------------------------------------------- Engine

TokenLogprob Engine::token_logprob(const float* logits, int32_t token, int top) const {
  const std::vector<double> lp = model::log_softmax(logits, weights_.config.vocab);
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
    : weights_(weights),
      tok_(tokenizer),
      opt_((runtime::make_model(weights, options.cache, options.theta, 1), std::move(options))),  // validates the spec
      pool_({opt_.pool_budget, opt_.cache_dir, opt_.cache_dir_budget},
            [this](const uint8_t* data, size_t size, const std::string& path) {
              return runtime::block_info(data, size, path, key());
            }) {
  StoreOptions store = opt_.store;
  store.max_value = runtime::max_block_bytes(weights.config);
  if (!store.url.empty())
    store_ = std::make_unique<BlockStore>(store, runtime::chain_root(key()),
                                          [this](const uint8_t* data, size_t size) {
                                            return runtime::block_info(data, size, "kv store value", key());
                                          });
}

std::vector<float> Engine::restore_prefix(const std::vector<int32_t>& prompt, model::LlamaModel& m,
                                          GenerateResult& res, Chain& chain) {
  size_t limit = prompt.size();
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<PrefixPool::Block> blocks =
        pool_.longest_chain(prompt, limit).value_or(std::vector<PrefixPool::Block>());
    const size_t local = blocks.size();
    const int64_t local_end = local > 0 ? blocks.back().info.end() : 0;
    if (store_ && local_end < static_cast<int64_t>(limit)) {  // nothing to ask for when the pool covers it all
      const uint64_t parent = local > 0 ? blocks.back().info.key : runtime::chain_root(key());
      for (PrefixPool::Block& b : store_->extend(prompt, limit, parent, local_end)) blocks.push_back(std::move(b));
    }
    if (blocks.empty()) return {};
    runtime::ChainRestored c = runtime::restore_chain(blocks, key(), prompt, m);
    runtime::Restored& r = c.restored;
    if (r.outcome == runtime::Restore::kUsed) {
      res.reused_tokens = r.tokens;
      chain.end = {blocks.back().info.key, r.tokens};
      for (const auto& b : blocks) chain.restored.push_back(b.info.key);
      for (size_t i = local; i < blocks.size(); ++i) pool_.add(blocks[i]);  // the store's, held here from now on
      if (store_ && local > 0)  // the store may have lost them (evicted, or down when they were made)
        store_->put(std::vector<PrefixPool::Block>(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(local)),
                    /*known_present=*/true);
      return std::move(r.logits);
    }
    if (r.outcome == runtime::Restore::kNoLogits) {
      limit = static_cast<size_t>(blocks.back().info.end() - 1);  // fine, but this prompt needs a shorter chain
    } else if (c.bad_block < local) {
      pool_.discard(blocks[c.bad_block].info.key);  // damaged, foreign, or not the block it was indexed as
    } else {
      store_->discard(blocks[c.bad_block].info.key);
    }
  }
  return {};
}

// Prefills what the pool did not restore. A prompt that shares a longer
// beginning with a pooled one than what was restored (another question about
// the same document) first prefills up to that point and pools it, so the next
// such prompt restores it.
void Engine::prefill(const std::vector<int32_t>& prompt, model::LlamaModel& m, std::vector<float>& logits,
                     Chain& chain) {
  const auto n = static_cast<int64_t>(prompt.size());
  if (m.position() >= n) return;
  auto prefill_to = [&](int64_t end) {
    logits = runtime::prefill_prompt(m, std::vector<int32_t>(prompt.begin() + m.position(), prompt.begin() + end));
    if (end < opt_.min_prefix) return;
    runtime::mark_restore_point(m);  // the blocks pooled here are the session's own from now on
    const std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + end);
    std::vector<runtime::ChainBlock> blocks = runtime::chain_blocks(key(), m, tokens, chain.end, logits);
    chain.end = {blocks.back().info.key, end};
    std::vector<PrefixPool::Block> held;
    for (runtime::ChainBlock& b : blocks) {
      held.push_back({std::move(b.info), std::make_shared<const std::vector<uint8_t>>(std::move(b.file))});
      pool_.add(held.back());
    }
    if (store_) store_->put(std::move(held));
  };
  const int64_t shared = pool_.shared_prefix(prompt);
  if (shared > m.position() && shared < n && shared >= opt_.min_prefix) prefill_to(shared);
  prefill_to(n);
}

namespace {

// The logits with a request's bias and penalties applied (`scratch` holds
// them when there are any).
const float* adjusted_logits(const GenerateRequest& req, const std::vector<float>& logits,
                             const std::unordered_map<int32_t, int>& counts, std::vector<float>& scratch) {
  if (req.logit_bias.empty() && ((req.presence_penalty == 0 && req.frequency_penalty == 0) || counts.empty()))
    return logits.data();
  scratch = logits;
  for (const auto& [id, bias] : req.logit_bias) scratch[static_cast<size_t>(id)] += bias;
  for (const auto& [id, n] : counts)
    scratch[static_cast<size_t>(id)] -= req.presence_penalty + req.frequency_penalty * static_cast<float>(n);
  return scratch.data();
}

}  // namespace

void Engine::decode(const GenerateRequest& req, model::LlamaModel& m, std::vector<float> logits,
                    GenerateResult& res) {
  model::Sampler sampler(req.sampler);
  TextStream stream(req.stop);
  res.finish_reason = "length";
  auto emit = [&](const std::string& text) {
    res.text += text;
    return text.empty() || !req.on_text || req.on_text(text);
  };
  bool stop_string = false;
  std::unordered_map<int32_t, int> counts;  // tokens generated so far (the penalties)
  std::vector<float> scratch;
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    if (req.keep_going && !req.keep_going()) {
      res.finish_reason = "cancelled";
      break;
    }
    if (std::chrono::steady_clock::now() >= req.deadline) {
      res.timed_out = true;
      break;
    }
    const float* scores = adjusted_logits(req, logits, counts, scratch);
    const int32_t next = sampler.sample(scores, weights_.config.vocab);
    if (tok_.ends_generation(next)) {
      res.finish_reason = "stop";
      break;
    }
    ++res.completion_tokens;
    ++counts[next];
    if (req.top_logprobs >= 0) res.logprobs.push_back(token_logprob(scores, next, req.top_logprobs));
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
}

QueuePlace& QueuePlace::operator=(QueuePlace&& o) noexcept {
  if (this != &o) {
    if (engine_) engine_->leave_queue();
    engine_ = std::exchange(o.engine_, nullptr);
  }
  return *this;
}

QueuePlace::~QueuePlace() {
  if (engine_) engine_->leave_queue();
}

QueuePlace Engine::enter_again() {
  std::lock_guard lock(slot_mutex_);
  ++waiting_;
  return QueuePlace(this);
}

QueuePlace Engine::enter() {
  std::lock_guard lock(slot_mutex_);
  if (busy_slots_ >= std::max(1, opt_.slots) && waiting_ >= opt_.max_queue) {
    std::lock_guard stats(stats_mutex_);
    ++stats_.busy;
    throw Busy{};
  }
  ++waiting_;
  return QueuePlace(this);
}

void Engine::leave_queue() {
  std::lock_guard lock(slot_mutex_);
  --waiting_;
}

GenerateResult Engine::generate(const GenerateRequest& req, QueuePlace place) {
  GenerateResult res;
  res.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  if (place.engine_ != this) place = enter();
  place.engine_ = nullptr;  // the slot guard takes the place over
  SlotGuard slot(slot_mutex_, slot_free_, busy_slots_, waiting_, std::max(1, opt_.slots), req.keep_going);
  if (slot.cancelled) {
    res.finish_reason = "cancelled";
    record(res);
    return res;
  }
  Chain chain;
  try {
    run(req, /*use_pool=*/true, res, chain);
  } catch (const Error&) {
    // Whatever the pooled chain held made the model fail (the files
    // validated, yet their values do not work): its blocks are dropped, and
    // the request runs again from scratch unless text was already sent; an
    // error without a pooled prefix is the request's own.
    if (chain.restored.empty()) throw;
    pool_.discard(chain.restored.front());  // and every block after it
    if (store_) store_->discard(chain.restored.front());  // the blocks after it are unreachable there
    if (res.completion_tokens > 0) throw;
    res = GenerateResult{};
    res.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    chain = Chain{};
    run(req, /*use_pool=*/false, res, chain);
  }
  record(res);
  return res;
}

void Engine::run(const GenerateRequest& req, bool use_pool, GenerateResult& res, Chain& chain) {
  model::LlamaModel m = runtime::make_model(weights_, opt_.cache, opt_.theta, opt_.threads);
  auto t0 = Clock::now();
  std::vector<float> logits = use_pool ? restore_prefix(req.prompt, m, res, chain) : std::vector<float>();
  prefill(req.prompt, m, logits, chain);
  res.prefill_s = since(t0);
  t0 = Clock::now();
  decode(req, m, std::move(logits), res);
  res.decode_s = since(t0);
}

void Engine::record(const GenerateResult& res) {
  std::lock_guard lock(stats_mutex_);
  stats_.requests += 1;
  stats_.prompt_tokens += res.prompt_tokens;
  if (res.finish_reason != "cancelled" || res.prefill_s > 0)
    stats_.prefilled_tokens += res.prompt_tokens - res.reused_tokens;
  stats_.completion_tokens += res.completion_tokens;
  stats_.cancelled += res.finish_reason == "cancelled";
  stats_.timed_out += res.timed_out;
  stats_.prefill_s += res.prefill_s;
  stats_.decode_s += res.decode_s;
}

Engine::Persisted Engine::persist(std::chrono::steady_clock::time_point deadline) {
  Persisted p;
  p.pool = pool_.persist(deadline);
  if (store_) {
    const StoreMetrics before = store_->metrics();
    store_->flush(deadline);
    const StoreMetrics after = store_->metrics();
    p.store_blocks = after.blocks_written - before.blocks_written;
    p.store_dropped = after.dropped_writes - before.dropped_writes;
  }
  return p;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard lock(stats_mutex_);
    m = stats_;
  }
  m.pool = pool_.metrics();
  if (store_) m.store = store_->metrics();
  return m;
}

}  // namespace anchorkv::serve
