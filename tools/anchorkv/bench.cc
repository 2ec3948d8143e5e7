// `anchorkv bench attention`: decode attention on the compressed cache vs
// dense fp16 attention, side by side in one run, plus the machine's read
// bandwidth measured in the same run. Every figure is measured here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "anchorkv/anchorkv.h"
#include "commands.h"
#include "core/buffer.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "eval/workload.h"

namespace anchorkv::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Read bandwidth: every thread sums its share of a large buffer (more than
// any cache level), best of several passes. Bytes read / seconds.
double machine_read_gbps(int threads, int64_t bytes) {
  const int64_t n = bytes / 4;
  core::UninitVector<float> buf(static_cast<size_t>(n));
  const int T = core::resolve_threads(threads);
  core::parallel_for(T, T, [&](int64_t t) {  // first touch by the readers
    const int64_t a = n * t / T, b = n * (t + 1) / T;
    for (int64_t i = a; i < b; ++i) buf[static_cast<size_t>(i)] = 1.0f;
  });
  std::vector<float> sums(static_cast<size_t>(T));
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    core::parallel_for(T, T, [&](int64_t t) {
      const int64_t a = n * t / T, b = n * (t + 1) / T;
      // Blocked dot with a small vector kept in L1: the loads are the cost.
      static thread_local std::vector<float> ones(4096, 1.0f);
      float s = 0;
      for (int64_t i = a; i < b; i += 4096) s += core::dot(&buf[static_cast<size_t>(i)], ones.data(), std::min<int64_t>(4096, b - i));
      sums[t] = s;
    });
    best = std::max(best, static_cast<double>(bytes) / since(t0) / 1e9);
  }
  if (sums[0] < 0) std::printf(" ");  // keep the sums alive
  return best;
}

// Median seconds of `reps` calls of f, interleaved with g's: returns {f, g}.
template <class F, class G>
std::pair<double, double> median_pair(int reps, F&& f, G&& g) {
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    a.push_back(since(t0));
    t0 = Clock::now();
    g();
    b.push_back(since(t0));
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {a[a.size() / 2], b[b.size() / 2]};
}

struct Options {
  std::vector<int64_t> seqs = {4096, 32768, 131072};
  int64_t heads = 8, group = 4, dim = 128;
  double theta = 0.05;
  int threads = 0;
  int reps = 9;
  bool json = false;
};

void run_attention(const Options& opt) {
  const int threads = core::resolve_threads(opt.threads);
  const int64_t H = opt.heads, Hq = opt.heads * opt.group, D = opt.dim;
  nlohmann::json rows = nlohmann::json::array();
  const double machine = machine_read_gbps(threads, int64_t{1} << 30);
  if (!opt.json) {
    fmt::print("Decode attention (Sq = 1), B = 1, H = {} KV heads, Hq = {} query heads, D = {}, theta {}, {} threads, {}\n",
               H, Hq, D, opt.theta, threads, core::simd_target_name());
    fmt::print("machine read bandwidth (this run): {:.1f} GB/s\n\n", machine);
    fmt::print("  {:>7} {:>10} {:>14} {:>8} {:>11} {:>8} {:>7} {:>12}\n", "S", "dense ms", "compressed ms", "speedup",
               "dense GB/s", "of peak", "ratio", "compress ms");
  }
  for (int64_t S : opt.seqs) {
    eval::SyntheticSpec spec;
    spec.B = 1;
    spec.H = H;
    spec.S = S;
    spec.D = D;
    spec.n_queries = opt.group;  // one decode query per query head
    const eval::Workload w = eval::make_synthetic(spec);
    AnchorKVConfig cfg;
    cfg.theta = opt.theta;
    cfg.threads = opt.threads;
    AnchorKVCache compressed(cfg);
    FullKVCache dense;
    compressed.update_and_fetch(w.keys(), w.values());
    dense.update_and_fetch(w.keys(), w.values());
    const double compress_s = compressed.last_compression_stats().total_s;
    // The decode query of each query head: [1, Hq, 1, D] (query head hq of KV head hq / group).
    const TensorView q = TensorView::f32(w.Q.data(), {1, Hq, 1, D});
    AttentionOptions ao;
    ao.threads = opt.threads;
    AttentionStats cs;
    attend(q, compressed, ao, &cs);  // warm up both
    attend(q, dense, ao);
    const auto [dense_s, comp_s] = median_pair(opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, compressed, ao); });
    const double kv_bytes = static_cast<double>(H * S * D * 2 * 2);
    const double dense_gbps = kv_bytes / dense_s / 1e9;
    nlohmann::json r = {{"S", S},
                        {"dense_ms", dense_s * 1e3},
                        {"compressed_ms", comp_s * 1e3},
                        {"speedup", dense_s / comp_s},
                        {"dense_gbps", dense_gbps},
                        {"machine_gbps", machine},
                        {"dense_fraction_of_machine", dense_gbps / machine},
                        {"compression_ratio", compressed.compression_ratio()},
                        {"compress_ms", compress_s * 1e3},
                        {"compress_stages_ms",
                         {{"scores", compressed.last_compression_stats().scores_s * 1e3},
                          {"anchors", compressed.last_compression_stats().anchors_s * 1e3},
                          {"assign_utility", compressed.last_compression_stats().assign_s * 1e3},
                          {"allocate", compressed.last_compression_stats().allocate_s * 1e3},
                          {"encode", compressed.last_compression_stats().encode_s * 1e3}}},
                        {"attention_workspace_bytes", cs.workspace_bytes},
                        {"threads", threads},
                        {"reps", opt.reps}};
    rows.push_back(r);
    if (!opt.json)
      fmt::print("  {:>7} {:>10.3f} {:>14.3f} {:>7.1f}x {:>11.1f} {:>7.0f}% {:>6.1f}x {:>12.1f}\n", S, dense_s * 1e3,
                 comp_s * 1e3, dense_s / comp_s, dense_gbps, 100 * dense_gbps / machine,
                 compressed.compression_ratio(), compress_s * 1e3);
  }
  if (opt.json)
    std::printf("%s\n", nlohmann::json{{"benchmark", "attention"}, {"simd_target", core::simd_target_name()},
                                       {"results", rows}}
                            .dump(2)
                            .c_str());
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks measured side by side in one run");
  bench->require_subcommand(1);
  auto opt = std::make_shared<Options>();
  CLI::App* att = bench->add_subcommand("attention", "Compressed vs dense fp16 decode attention");
  att->add_option("--seq", opt->seqs, "sequence lengths")->delimiter(',');
  att->add_option("--heads", opt->heads, "KV heads")->check(CLI::Range(1, 256));
  att->add_option("--group", opt->group, "query heads per KV head (GQA)")->check(CLI::Range(1, 64));
  att->add_option("--head-dim", opt->dim, "head dimension")->check(CLI::Range(1, 1024));
  att->add_option("--theta", opt->theta, "AnchorKV theta");
  att->add_option("--threads", opt->threads, "threads (0 = all cores)");
  att->add_option("--reps", opt->reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  att->add_flag("--json", opt->json, "print JSON");
  att->callback([opt] { run_attention(*opt); });
}

}  // namespace anchorkv::cli
