#include "runtime/session.h"

#include <algorithm>

#include "anchorkv/anchorkv.h"
#include "cache/cache_traits.h"
#include "cache/segment_chain.h"

namespace anchorkv::runtime {

std::unique_ptr<KVCache> make_layer_cache(const cache::CacheSpec& spec, const model::LlamaConfig& config,
                                          double theta, int threads) {
  return spec.make(theta, threads, config.rope);
}

cache::CacheSpec session_spec(const std::string& spec) {
  cache::CacheSpec c = cache::parse_cache_spec(spec);
  if (!c.anchorkv() || c.oneshot) return c;
  if (c.segment_tokens == 0) c.segment_tokens = kSegmentTokens;
  if (c.recent_tokens < 0) c.recent_tokens = kRecentTokens;
  if (c.extend_tokens < 0) c.extend_tokens = kExtendTokens;
  return c;
}

model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta, int threads) {
  const cache::CacheSpec c = session_spec(spec);
  model::LlamaModel m(
      w,
      [c, theta, threads, &w](int64_t layer) {
        return make_layer_cache(c, w.config, c.layer_theta(theta, layer, w.config.n_layers), threads);
      },
      threads,
      c.pre_rope ? model::KeyRope::kPreRope : model::KeyRope::kPostRope);
  m.set_observation_window(c.observation_window(), c.segment_tokens > 0);
  m.set_bf16_arithmetic(!c.fp32_arithmetic);
  return m;
}

void close_prompt(const model::LlamaModel& m) {
  for (const auto& c : m.caches()) internal::end_prompt(*c);
}

void mark_restore_point(const model::LlamaModel& m) {
  for (const auto& c : m.caches()) internal::seal_segments(*c);
}

namespace {

// Whether `m`'s caches give a prompt's meaning whatever calls bring it.
bool takes_chunks(const model::LlamaModel& m) {
  return std::all_of(m.caches().begin(), m.caches().end(),
                     [](const auto& c) { return internal::takes_prompt_in_calls(*c); });
}

}  // namespace

std::vector<float> prefill_prompt(model::LlamaModel& m, const std::vector<int32_t>& prompt, int64_t chunk,
                                  const std::function<void()>& after_call) {
  const auto n = static_cast<int64_t>(prompt.size());
  if (n == 0) return m.forward(prompt);  // forward's own error
  if (chunk <= 0 || chunk >= n || !takes_chunks(m)) chunk = n;
  std::vector<float> logits;
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t end = std::min(n, at + chunk);
    logits = m.forward(std::vector<int32_t>(prompt.begin() + at, prompt.begin() + end));
    if (after_call) after_call();
  }
  close_prompt(m);
  return logits;
}

CacheTotals cache_totals(const model::LlamaModel& m) {
  CacheTotals t;
  for (const auto& c : m.caches()) {
    t.bytes += c->nbytes();
    t.full += c->full_seq_bytes();
    t.compressing += internal::compressing_in_background(*c) ? 1 : 0;
  }
  return t;
}

}  // namespace anchorkv::runtime
