#include "eval/compare.h"

#include <chrono>
#include <cmath>

#include "anchorkv/baselines.h"
#include "core/error.h"
#include "kernels/rope.h"

namespace anchorkv::eval {

std::vector<std::string> all_methods() {
  return {"full", "anchorkv", "anchorkv_compact", "quantized8", "quantized4", "quantized2", "kivi4", "kivi2", "streamingllm", "snapkv", "h2o"};
}

std::unique_ptr<KVCache> make_cache(const std::string& method, double theta, int threads) {
  if (method == "full") return std::make_unique<FullKVCache>();
  if (method == "anchorkv") {
    AnchorKVConfig cfg;
    cfg.theta = theta;
    cfg.threads = threads;
    return std::make_unique<AnchorKVCache>(cfg);
  }
  if (method == "anchorkv_compact") {
    AnchorKVConfig cfg;
    cfg.theta = theta;
    cfg.threads = threads;
    cfg.metadata = MetadataLayout::kCompact;
    return std::make_unique<AnchorKVCache>(cfg);
  }
  if (method == "quantized8") return std::make_unique<QuantizedKVCache>(8);
  if (method == "quantized4") return std::make_unique<QuantizedKVCache>(4);
  if (method == "quantized2") return std::make_unique<QuantizedKVCache>(2);
  if (method == "streamingllm") return std::make_unique<StreamingLLMCache>(theta);
  if (method == "snapkv") return std::make_unique<SnapKVCache>(theta);
  if (method == "h2o") return std::make_unique<H2OCache>(theta);
  if (method == "kivi2") return std::make_unique<KIVICache>(2);
  if (method == "kivi4") return std::make_unique<KIVICache>(4);
  core::fail(ErrorCode::kInvalidArgument, "anchorkv::eval::make_cache", "unknown method '" + method + "'");
}

std::vector<CompareRow> compare(const Workload& w, const std::vector<double>& thetas,
                                const std::vector<std::string>& methods, int threads,
                                const std::function<void(int, int, const std::string&)>& progress) {
  const auto& sp = w.spec;
  const int64_t rows = sp.B * sp.H;
  std::vector<CompareRow> out;
  const int total = static_cast<int>(thetas.size() * methods.size());
  int done = 0;
  for (double theta : thetas) {
    for (const std::string& m : methods) {
      auto cache = make_cache(m, theta, threads);
      const auto t0 = std::chrono::steady_clock::now();
      KVPair kv = cache->update_and_fetch(w.keys(), w.values());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::vector<float> kh = kv.keys.to_f32();
      const std::vector<float> vh = kv.values.to_f32();
      const int64_t kept = kv.keys.shape()[2];
      if (w.keys_pre_rope) {
        // Unrotated keys: rotate each to its position, as attention would (only
        // caches that keep every position can be scored this way).
        if (kept != sp.S)
          core::fail(ErrorCode::kInvalidArgument, "anchorkv::eval::compare",
                     "method '" + m + "' evicts tokens: it cannot store keys before RoPE");
        RopeOptions ro;
        ro.enabled = true;
        ro.base = w.rope_base;
        ro.style = w.rope_neox ? RopeStyle::kNeox : RopeStyle::kNormal;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t t = 0; t < sp.S; ++t) kernels::rope_rotate_at(&kh[(r * sp.S + t) * sp.D], sp.D, ro, t);
      }
      CompareRow r;
      r.method = m;
      r.theta = theta;
      r.bytes = cache->nbytes();
      r.full_bytes = cache->full_seq_bytes();
      r.budget_bytes = static_cast<int64_t>(std::floor(theta * static_cast<double>(r.full_bytes)));
      r.compression_ratio = cache->compression_ratio();
      r.over_budget = m != "full" && static_cast<double>(r.bytes) > 1.02 * static_cast<double>(r.budget_bytes);
      r.under_budget = m != "full" && static_cast<double>(r.bytes) < 0.98 * static_cast<double>(r.budget_bytes);
      r.tokens_kept = cache->tokens_kept();
      r.tokens_total = cache->tokens_total();
      r.error = attention_error(w.Q.data(), sp.n_queries, w.keys_pre_rope ? w.K_exact.data() : w.K.data(), w.V.data(),
                                kh.data(), vh.data(), rows, sp.S, sp.D, threads, kept);
      r.compress_ms = ms;
      out.push_back(r);
      if (progress) progress(++done, total, m + " theta=" + std::to_string(theta));
    }
  }
  return out;
}

}  // namespace anchorkv::eval
