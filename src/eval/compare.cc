#include "eval/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "anchorkv/attention.h"
#include "cache/registry.h"
#include "core/error.h"
#include "core/rope.h"

namespace anchorkv::eval {
namespace {

// A decode step's attention over the cache as stored: each head's first
// held-out query, attend() as the runtime calls it, median of five.
double attend_ms(const Workload& w, const KVCache& cache, int threads) {
  const auto& sp = w.spec;
  std::vector<float> q(static_cast<size_t>(sp.B * sp.H * sp.D));
  for (int64_t r = 0; r < sp.B * sp.H; ++r)
    std::copy_n(&w.Q[static_cast<size_t>(r * sp.n_queries * sp.D)], sp.D, &q[static_cast<size_t>(r * sp.D)]);
  AttentionOptions ao;
  ao.threads = threads;
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    attend(TensorView::f32(q.data(), {sp.B, sp.H, 1, sp.D}), cache, ao);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

}  // namespace

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
      auto cache = cache::parse_cache_spec(m).make(theta, threads);  // NAME or NAME:auto
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
          for (int64_t t = 0; t < sp.S; ++t) core::rope_rotate_at(&kh[(r * sp.S + t) * sp.D], sp.D, ro, t);
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
      r.attend_ms = w.keys_pre_rope ? 0.0 : attend_ms(w, *cache, threads);
      out.push_back(r);
      if (progress) progress(++done, total, m + " theta=" + std::to_string(theta));
    }
  }
  return out;
}

}  // namespace anchorkv::eval
