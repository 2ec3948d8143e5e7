#include "eval/compare.h"

#include <chrono>
#include <cmath>

#include "anchorkv/baselines.h"
#include "core/error.h"

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
      const std::vector<float> kh = kv.keys.to_f32(), vh = kv.values.to_f32();
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
      r.error = attention_error(w.Q.data(), sp.n_queries, w.K.data(), w.V.data(), kh.data(), vh.data(), rows, sp.S,
                                sp.D, threads, kv.keys.shape()[2]);
      r.compress_ms = ms;
      out.push_back(r);
      if (progress) progress(++done, total, m + " theta=" + std::to_string(theta));
    }
  }
  return out;
}

}  // namespace anchorkv::eval
