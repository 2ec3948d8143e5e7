// The serving engine behind `anchorkv serve`: generation on any cache with a
// pool of compressed prompt prefixes. No HTTP here (tools/anchorkv/serve.cc).
//
// Each request runs in one of `slots` parallel slots with caches of its own.
// Before prefilling, the pool (prefix_pool.h) is searched for the longest
// chain of blocks that begins the new prompt; its caches (kept as cache-file
// bytes, i.e. the compressed form) are validated and restored and only the
// rest is prefilled. After the prefill the prompt's new blocks enter the pool
// (runtime/prefix_chain.h: one per compressed segment for streaming AnchorKV,
// so a chat's turns share the blocks of the turns before), which holds at
// most `pool_budget` bytes, evicting the least recently used blocks. A
// prompt that shares a longer beginning with a pooled prompt (a second
// question about the same document) is prefilled in two steps and that
// beginning is pooled too, so later prompts restore it.
//
// With a store shared by replicas (block_store.h), a chain is continued from
// the store past where the pool's ends, the blocks found there join the pool,
// and every new block is written to the store (in the background).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/prefix_chain.h"
#include "runtime/prompt_cache.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "serve/block_store.h"
#include "serve/prefix_pool.h"

namespace anchorkv::serve {

struct EngineOptions {
  std::string cache = "anchorkv_tight:pre:obs:auto";  // cache spec per layer (cache/registry.h); the recommended one
  double theta = 0.05;
  int threads = 0;                    // per request's model
  int slots = 1;                      // requests generating at once
  int max_queue = 64;                 // requests waiting for a slot; more are refused (Busy)
  int64_t pool_budget = int64_t{1} << 30;  // bytes of cached prefixes
  int64_t min_prefix = 16;            // shorter prompts are not pooled
  // Entries evicted from memory are written here as cache files and loaded
  // back on a hit (empty: evicted entries are dropped). Files found at start
  // are indexed when they were written for `model_identity` and this cache.
  std::string cache_dir;
  int64_t cache_dir_budget = 0;  // bytes of spilled blocks cache_dir keeps (oldest out first); 0: no bound
  std::string model_identity;
  // A store shared by replicas (block_store.h), below the pool and the
  // folder; store.url empty: none.
  StoreOptions store;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  model::SamplerOptions sampler;
  std::vector<std::string> stop;  // the text ends before the first of these
  int top_logprobs = -1;          // >= 0: record each token's log-probability and this many alternatives
  // OpenAI's logit changes, before sampling (and in the log-probabilities):
  // a bias per token id, and for each token generated so far, presence *
  // (count > 0) + frequency * count subtracted.
  std::vector<std::pair<int32_t, float>> logit_bias;
  float presence_penalty = 0, frequency_penalty = 0;
  // Called with each new piece of text (complete UTF-8, stop strings held
  // back); returning false cancels the request (the client went away).
  std::function<bool(const std::string&)> on_text;
  // Asked while the request waits for a slot and before every step; false
  // cancels it (the client went away).
  std::function<bool()> keep_going;
  // Generation stops here (finish_reason "length", `timed_out` set).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct TokenLogprob {
  std::string piece;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;  // most likely first
};

struct GenerateResult {
  std::string text;
  std::vector<TokenLogprob> logprobs;  // per generated token, when asked for
  std::string finish_reason;  // "stop", "length" or "cancelled"
  bool timed_out = false;     // the deadline ended it
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t reused_tokens = 0;  // prompt tokens restored from the pool
  double prefill_s = 0, decode_s = 0;
};

// Thrown by enter() (and generate() without a place) when max_queue
// requests already wait for a slot.
struct Busy {};

class Engine;
// A place among the requests waiting for a slot, taken before a response
// starts (a stream's status line goes out before it waits): a request that
// holds one is never refused for a full queue. Given up when destroyed
// unless generate() took it.
class QueuePlace {
 public:
  QueuePlace() = default;
  QueuePlace(QueuePlace&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)) {}
  QueuePlace& operator=(QueuePlace&& o) noexcept;
  ~QueuePlace();

 private:
  friend class Engine;
  explicit QueuePlace(Engine* e) : engine_(e) {}
  Engine* engine_ = nullptr;
};

struct EngineMetrics {
  int64_t requests = 0, prompt_tokens = 0, prefilled_tokens = 0, completion_tokens = 0;
  int64_t cancelled = 0, timed_out = 0, busy = 0;
  double prefill_s = 0, decode_s = 0;
  PoolMetrics pool;
  std::optional<StoreMetrics> store;  // when there is one
};

class Engine {
 public:
  Engine(const model::LlamaWeights& weights, const model::Tokenizer& tokenizer, EngineOptions options);
  // A place in the queue; throws Busy when max_queue requests already wait.
  QueuePlace enter();
  // A place for a request already admitted (its next choice): never refused.
  QueuePlace enter_again();
  // Thread-safe; waits for a free slot in the place given (or one taken
  // here: throws Busy when too many wait).
  GenerateResult generate(const GenerateRequest& request, QueuePlace place);
  GenerateResult generate(const GenerateRequest& request) { return generate(request, enter()); }
  // Before the process exits: writes the pool's blocks to the folder and the
  // store's queue to the store, most recently used first, until `deadline`.
  struct Persisted {
    PoolPersisted pool;
    int64_t store_blocks = 0, store_dropped = 0;  // written to the store while waiting; not written
  };
  Persisted persist(std::chrono::steady_clock::time_point deadline);
  EngineMetrics metrics() const;
  const EngineOptions& options() const { return opt_; }
  // Whether the shared store answers (nothing without one); takes no lock.
  std::optional<bool> store_up() const { return store_ ? std::optional<bool>(store_->up()) : std::nullopt; }

 private:
  // Where a request's caches stand against the pool: the chain they were
  // restored from or pooled as, and the blocks restored.
  struct Chain {
    runtime::ChainEnd end;
    std::vector<uint64_t> restored;
  };
  // Restores the longest usable chain into `m`: the pool's, continued from
  // the store (blocks found bad are dropped where they came from); returns
  // the logits after it (empty when none).
  std::vector<float> restore_prefix(const std::vector<int32_t>& prompt, model::LlamaModel& m, GenerateResult& res,
                                    Chain& chain);
  void prefill(const std::vector<int32_t>& prompt, model::LlamaModel& m, std::vector<float>& logits, Chain& chain);
  void decode(const GenerateRequest& req, model::LlamaModel& m, std::vector<float> logits, GenerateResult& res);
  // One attempt: restore (when use_pool), prefill, decode.
  void run(const GenerateRequest& req, bool use_pool, GenerateResult& res, Chain& chain);
  void record(const GenerateResult& res);
  TokenLogprob token_logprob(const float* logits, int32_t token, int top) const;
  runtime::PromptCacheKey key() const { return {opt_.model_identity, opt_.cache, opt_.theta}; }

  friend class QueuePlace;
  void leave_queue();  // a place given up

  const model::LlamaWeights& weights_;
  const model::Tokenizer& tok_;
  const EngineOptions opt_;
  std::mutex slot_mutex_;
  std::condition_variable slot_free_;
  int busy_slots_ = 0, waiting_ = 0;
  PrefixPool pool_;
  std::unique_ptr<BlockStore> store_;
  mutable std::mutex stats_mutex_;  // guards stats_ (never held across work)
  EngineMetrics stats_;
};

// Keeps text back until it is complete UTF-8 and cannot be the start of a
// stop string; finish() returns what remains, cut at a stop string. Each
// stop string is followed by a matching automaton (Knuth-Morris-Pratt), so a
// piece costs its own length whatever the stop strings' lengths.
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop);
  // Appends a piece; returns the text now safe to emit. *stopped when a stop
  // string appeared (the text before the earliest one is returned; nothing
  // follows).
  std::string push(const std::string& piece, bool* stopped);
  std::string finish();

 private:
  struct Matcher {
    std::string text;
    std::vector<uint32_t> fallback;  // KMP: the longest proper border of text[0, i]
    size_t matched = 0;              // how much of text the stream's tail is
  };
  std::vector<Matcher> stop_;
  std::string pending_;
};

}  // namespace anchorkv::serve
