#include "runtime/session.h"

namespace anchorkv::runtime {

std::unique_ptr<KVCache> make_layer_cache(const cache::CacheSpec& spec, const model::LlamaConfig& config,
                                          double theta, int threads) {
  return spec.key_rope ? model::with_key_rope(spec.make(theta, threads), config) : spec.make(theta, threads);
}

model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta, int threads) {
  const cache::CacheSpec c = cache::parse_cache_spec(spec);
  model::LlamaModel m(
      w, [c, theta, threads, &w](int64_t) { return make_layer_cache(c, w.config, theta, threads); }, threads,
      c.pre_rope ? model::KeyRope::kPreRope : model::KeyRope::kPostRope);
  m.set_observation_window(c.observation_window());
  return m;
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
