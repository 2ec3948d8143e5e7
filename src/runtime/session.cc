#include "runtime/session.h"

#include "anchorkv/anchorkv.h"

namespace anchorkv::runtime {

std::unique_ptr<KVCache> make_layer_cache(const cache::CacheSpec& spec, const model::LlamaConfig& config,
                                          double theta, int threads) {
  return spec.key_rope ? model::with_key_rope(spec.make(theta, threads), config) : spec.make(theta, threads);
}

cache::CacheSpec session_spec(const std::string& spec) {
  cache::CacheSpec c = cache::parse_cache_spec(spec);
  if (!c.anchorkv() || c.oneshot) return c;
  if (c.segment_tokens == 0) c.segment_tokens = kSegmentTokens;
  if (c.recent_tokens < 0) c.recent_tokens = kRecentTokens;
  return c;
}

model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta, int threads) {
  const cache::CacheSpec c = session_spec(spec);
  model::LlamaModel m(
      w, [c, theta, threads, &w](int64_t) { return make_layer_cache(c, w.config, theta, threads); }, threads,
      c.pre_rope ? model::KeyRope::kPreRope : model::KeyRope::kPostRope);
  m.set_observation_window(c.observation_window(), c.segment_tokens > 0);
  return m;
}

void close_prompt(const model::LlamaModel& m) {
  for (const auto& c : m.caches()) {
    auto* a = dynamic_cast<AnchorKVCache*>(c.get());
    if (!a || !a->config().streaming()) continue;
    try {
      a->compress_now();
    } catch (const anchorkv::Error& e) {
      if (e.code() != ErrorCode::kInvalidState) throw;  // nothing exact left to close
    }
  }
}

std::vector<float> prefill_prompt(model::LlamaModel& m, const std::vector<int32_t>& prompt) {
  std::vector<float> logits = m.forward(prompt);
  close_prompt(m);
  return logits;
}

CacheTotals cache_totals(const model::LlamaModel& m) {
  CacheTotals t;
  for (const auto& c : m.caches()) {
    t.bytes += c->nbytes();
    t.full += c->full_seq_bytes();
  }
  return t;
}

}  // namespace anchorkv::runtime
