// A session's model: the weights, one cache per layer built from a cache spec
// ("NAME[:pre][:obs][:auto][:keyrope]", cache/registry.h), and the position.
// What every front end (eval, serve, the CLI, the public Runtime) builds a
// model through.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cache/registry.h"
#include "model/llama.h"

namespace anchorkv::runtime {

// One layer's cache of `spec` for a model of `config` (:keyrope: the model's
// RoPE passed to AnchorKV, model::with_key_rope).
std::unique_ptr<KVCache> make_layer_cache(const cache::CacheSpec& spec, const model::LlamaConfig& config,
                                          double theta, int threads);

// A model whose every layer holds the cache `spec` (local sliding-window
// layers hold their ring whatever the spec), keys stored before RoPE with
// :pre, the observation window :obs asks for.
model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta, int threads);

struct CacheTotals {
  int64_t bytes = 0, full = 0;  // stored bytes, fp16 bytes for the same tokens (all layers)
  double ratio() const { return bytes > 0 ? static_cast<double>(full) / static_cast<double>(bytes) : 1.0; }
};
CacheTotals cache_totals(const model::LlamaModel& m);

}  // namespace anchorkv::runtime
