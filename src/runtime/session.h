// A session's model: the weights, one cache per layer built from a cache spec
// ("NAME[:pre][:obs][:auto][:keyrope]", cache/registry.h), and the position.
// What every front end (eval, serve, the CLI, the public Runtime) builds a
// model through.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cache/registry.h"
#include "model/llama.h"

namespace anchorkv::runtime {

// The runtime streams AnchorKV (docs/spec.md §4.8): a spec that names no
// :segN and no :oneshot gets segments of kSegmentTokens behind kRecentTokens
// exact tokens (:segN alone keeps kRecentTokens), each extending the one
// before it up to kExtendTokens (:extN sets it; :ext0 keeps every segment on
// its own). Chosen by measurement (docs/results.md, "Whole sessions").
inline constexpr int64_t kSegmentTokens = 128, kRecentTokens = 32, kExtendTokens = 1024;
cache::CacheSpec session_spec(const std::string& spec);

// One layer's cache of `spec` for a model of `config` (:keyrope: AnchorKV
// codes key residuals after the model's RoPE at their positions, so attention
// need not rotate them each step; faster decode, but on the d128 model up to
// 3x the KL of residuals coded as given, docs/results.md). `spec` as
// session_spec gives it.
std::unique_ptr<KVCache> make_layer_cache(const cache::CacheSpec& spec, const model::LlamaConfig& config,
                                          double theta, int threads);

// A model whose every layer holds the cache `spec` (local sliding-window
// layers hold their ring whatever the spec), keys stored before RoPE with
// :pre, the observation window :obs asks for.
model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta, int threads);

// The end of a prompt: every streaming AnchorKV layer closes its exact tail
// into a segment (AnchorKVCache::compress_now), scored by the prompt's own
// last queries, so a prompt is held compressed as a whole (as the seed's
// cache holds it) and a pooled or saved prompt stores no exact tail; the
// tokens generated after it stream. Other caches are left as they are.
void close_prompt(const model::LlamaModel& m);
// A restore point after a prompt (internal::seal_segments on every layer):
// its streaming segments are never extended, so blocks of them pooled now
// restore a session that goes on with this one's bits. A prefix pool marks
// one wherever it cuts blocks; elsewhere the next tokens' segments may
// extend the prompt's last (AnchorKVConfig::extend_tokens).
void mark_restore_point(const model::LlamaModel& m);
// A prompt (or the rest of one) through the model in calls of at most
// `chunk` tokens (0: one call), then close_prompt: how every front end feeds
// a prompt. Returns the last position's logits. Chunks bound the prefill's
// memory (the activations of one call grow with its tokens: ~28 KB a token on
// a 512-wide model, ~200 KB on an 8B one) and let a streaming cache compress
// the prompt as it arrives; each chunk attends over the cache as stored
// (compressed segments included), as a chat's next turn does. Only models
// whose every cache is exact, a ring or streaming AnchorKV are chunked: the
// one-shot caches (AnchorKV's seed mode, SnapKV, H2O, ...) compress or evict
// at the end of their first call, so they take the prompt in one.
inline constexpr int64_t kPrefillChunk = 2048;
// `after_call` (when set) runs after each call, e.g. to watch the caches grow.
std::vector<float> prefill_prompt(model::LlamaModel& m, const std::vector<int32_t>& prompt,
                                  int64_t chunk = kPrefillChunk, const std::function<void()>& after_call = {});

struct CacheTotals {
  int64_t bytes = 0, full = 0;  // stored bytes, fp16 bytes for the same tokens (all layers)
  int64_t compressing = 0;      // layers with a segment compressing off the decode path
  double ratio() const { return bytes > 0 ? static_cast<double>(full) / static_cast<double>(bytes) : 1.0; }
};
CacheTotals cache_totals(const model::LlamaModel& m);

}  // namespace anchorkv::runtime
