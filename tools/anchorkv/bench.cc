// `anchorkv bench attention`: decode attention on the compressed cache vs
// dense fp16 attention, side by side in one run, plus the machine's read
// bandwidth measured in the same run. Every figure is measured here.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/buffer.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "eval/metrics.h"
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
      for (int64_t i = a; i < b; i += 4096)
        s += core::dot(&buf[static_cast<size_t>(i)], ones.data(), std::min<int64_t>(4096, b - i));
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
  std::string metadata = "seed";
  std::string peer = "turboquant:k2v2";  // a second cache timed beside dense ("" for none)
  int64_t segments = 1;                  // > 1: the same tokens as that many streaming segments, timed too
  int threads = 0;
  int reps = 9;
  bool json = false;
};

// The same layer with keys stored before RoPE (the paper's form) and RoPE
// applied inside attention: {dense ms, compressed ms}, medians side by side.
AnchorKVConfig bench_config(const Options& opt) {
  AnchorKVConfig cfg;
  cfg.theta = opt.theta;
  cfg.threads = opt.threads;
  cfg.metadata = opt.metadata == "tight"     ? MetadataLayout::kTight
                 : opt.metadata == "compact" ? MetadataLayout::kCompact
                                             : MetadataLayout::kSeed;
  return cfg;
}

// Pre-RoPE keys, RoPE in attention: dense, compressed with residuals coded as
// given (the default), and compressed with key residuals coded at their
// positions (AnchorKVConfig::key_rope, the runtime's :pre:keyrope), in ms.
struct PreRopeTimes {
  double dense_ms = 0, compressed_ms = 0, keyrope_ms = 0;
};

PreRopeTimes time_pre_rope(eval::SyntheticSpec spec, const Options& opt) {
  spec.rope = false;
  spec.query_position = spec.S - 1;  // attend() places the query at the last cached position
  const eval::Workload w = eval::make_synthetic(spec);
  AttentionOptions ao;
  ao.threads = opt.threads;
  ao.rope.enabled = true;
  ao.rope.base = spec.rope_base;
  ao.rope.style = RopeStyle::kNormal;
  AnchorKVConfig at_positions = bench_config(opt);
  at_positions.key_rope = ao.rope;
  AnchorKVCache compressed(bench_config(opt)), keyrope(at_positions);
  FullKVCache dense;
  for (KVCache* c : std::vector<KVCache*>{&compressed, &keyrope, &dense}) {
    c->update(w.keys(), w.values());
  }
  const TensorView q = TensorView::f32(w.Q.data(), {1, opt.heads * opt.group, 1, opt.dim});
  for (KVCache* c : std::vector<KVCache*>{&compressed, &keyrope, &dense}) attend(q, *c, ao);  // warm up
  const auto [dense_s, comp_s] = median_pair(
      opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, compressed, ao); });
  const double keyrope_s =
      median_pair(opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, keyrope, ao); }).second;
  return {dense_s * 1e3, comp_s * 1e3, keyrope_s * 1e3};
}

// The peer cache over the same layer: {ms, ratio}, its calls alternated with dense ones.
std::pair<double, double> time_peer(const eval::Workload& w, const TensorView& q, const FullKVCache& dense,
                                    const Options& opt) {
  auto peer = cache::parse_cache_spec(opt.peer).make(opt.theta, opt.threads);
  peer->update(w.keys(), w.values());
  AttentionOptions ao;
  ao.threads = opt.threads;
  attend(q, *peer, ao);  // warm up
  const double s = median_pair(opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, *peer, ao); }).second;
  return {s * 1e3, peer->compression_ratio()};
}

// The same layer held as opt.segments streaming segments of S / segments
// tokens (the rest exact): its ms, its calls alternated with the one-segment
// cache's.
double time_segments(const eval::Workload& w, const TensorView& q, const AnchorKVCache& one, int64_t S,
                     const Options& opt) {
  AnchorKVConfig cfg = bench_config(opt);
  cfg.segment_tokens = S / opt.segments;
  AnchorKVCache many(cfg);
  // One call per segment: a single call of S tokens would close up to 16
  // segment lengths per segment (docs/spec.md §4.8), fewer than asked for.
  const auto tokens = [&](const TensorView& x, int64_t at) {
    TensorView t = x;
    t.data = static_cast<const char*>(x.data) + at * x.strides[2] * static_cast<int64_t>(sizeof(float));
    t.shape[2] = std::min(cfg.segment_tokens, S - at);
    return t;
  };
  for (int64_t at = 0; at < S; at += cfg.segment_tokens) many.update(tokens(w.keys(), at), tokens(w.values(), at));
  AttentionOptions ao;
  ao.threads = opt.threads;
  attend(q, many, ao);  // warm up
  return 1e3 * median_pair(opt.reps, [&] { attend(q, one, ao); }, [&] { attend(q, many, ao); }).second;
}

// The roofs this run's kernels are held against: read bandwidth and vector
// multiply-adds, both measured on the bench's thread count.
struct Machine {
  double gbps = 0;
  core::MulAddRate fma;
};

Machine measure_machine(int threads) {
  return {machine_read_gbps(threads, int64_t{1} << 30), core::measure_multiply_add_rate(threads)};
}

void print_attention_header(const Options& opt, int threads, const Machine& machine) {
  fmt::print(
      "Decode attention (Sq = 1), B = 1, H = {} KV heads, Hq = {} query heads, D = {}, theta {}, {} metadata, {} "
      "threads, {}\n",
      opt.heads, opt.heads * opt.group, opt.dim, opt.theta, opt.metadata, threads, core::simd_target_name());
  fmt::print("machine read bandwidth (this run): {:.1f} GB/s; fp32 multiply-adds: {:.1f} G lanes/s ({}-lane "
             "vectors)\n\n",
             machine.gbps, machine.fma.lanes_per_second / 1e9, machine.fma.lanes);
  fmt::print("  {:>7} {:>10} {:>14} {:>8} {:>11} {:>8} {:>7} {:>12} {:>13} {:>14} {:>14}", "S", "dense ms",
             "compressed ms", "speedup", "dense GB/s", "of peak", "ratio", "compress ms", "pre dense ms",
             "pre compr. ms", "pre keyrope ms");
  if (!opt.peer.empty()) fmt::print(" {:>{}} {:>7}", opt.peer + " ms", std::max<size_t>(10, opt.peer.size() + 3), "ratio");
  if (opt.segments > 1) fmt::print(" {:>14} {:>9}", fmt::format("{} segs ms", opt.segments), "vs one");
  fmt::print("\n");
}

void print_attention_json(const nlohmann::json& rows, const Machine& machine) {
  const nlohmann::json fma = {{"lanes_per_second", machine.fma.lanes_per_second}, {"vector_lanes", machine.fma.lanes}};
  const nlohmann::json out = {{"benchmark", "attention"},
                              {"simd_target", core::simd_target_name()},
                              {"machine_multiply_adds", fma},
                              {"results", rows}};
  std::printf("%s\n", out.dump(2).c_str());
}

void run_attention(const Options& opt) {
  const int threads = core::resolve_threads(opt.threads);
  const int64_t H = opt.heads, Hq = opt.heads * opt.group, D = opt.dim;
  nlohmann::json rows = nlohmann::json::array();
  const Machine machine = measure_machine(threads);
  if (!opt.json) print_attention_header(opt, threads, machine);
  for (int64_t S : opt.seqs) {
    eval::SyntheticSpec spec;
    spec.B = 1;
    spec.H = H;
    spec.S = S;
    spec.D = D;
    spec.n_queries = opt.group;  // one decode query per query head
    const eval::Workload w = eval::make_synthetic(spec);
    AnchorKVCache compressed(bench_config(opt));
    FullKVCache dense;
    compressed.update(w.keys(), w.values());
    dense.update(w.keys(), w.values());
    const double compress_s = compressed.last_compression_stats().total_s;
    // The decode query of each query head: [1, Hq, 1, D] (query head hq of KV head hq / group).
    const TensorView q = TensorView::f32(w.Q.data(), {1, Hq, 1, D});
    AttentionOptions ao;
    ao.threads = opt.threads;
    AttentionStats cs;
    attend(q, compressed, ao, &cs);  // warm up both
    attend(q, dense, ao);
    const auto [dense_s, comp_s] = median_pair(
        opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, compressed, ao); });
    const double kv_bytes = static_cast<double>(H * S * D * 2 * 2);
    const double dense_gbps = kv_bytes / dense_s / 1e9;
    nlohmann::json r = {{"S", S},
                        {"dense_ms", dense_s * 1e3},
                        {"compressed_ms", comp_s * 1e3},
                        {"speedup", dense_s / comp_s},
                        {"dense_gbps", dense_gbps},
                        {"machine_gbps", machine.gbps},
                        {"dense_fraction_of_machine", dense_gbps / machine.gbps},
                        {"compression_ratio", compressed.compression_ratio()},
                        {"compress_ms", compress_s * 1e3},
                        {"compress_stages_ms",
                         {{"scores", compressed.last_compression_stats().scores_s * 1e3},
                          {"anchors", compressed.last_compression_stats().anchors_s * 1e3},
                          {"assign_utility", compressed.last_compression_stats().assign_s * 1e3},
                          {"allocate", compressed.last_compression_stats().allocate_s * 1e3},
                          {"encode", compressed.last_compression_stats().encode_s * 1e3}}},
                        {"attention_workspace_bytes", cs.workspace_bytes},
                        {"metadata", opt.metadata},
                        {"residuals", compressed.n_residual_total()},
                        {"threads", threads},
                        {"reps", opt.reps}};
    const PreRopeTimes pre = time_pre_rope(spec, opt);
    r["pre_rope_dense_ms"] = pre.dense_ms;
    r["pre_rope_compressed_ms"] = pre.compressed_ms;
    r["pre_rope_keyrope_compressed_ms"] = pre.keyrope_ms;
    std::pair<double, double> peer{0, 0};
    if (!opt.peer.empty()) {
      peer = time_peer(w, q, dense, opt);
      r["peer"] = {{"cache", opt.peer}, {"ms", peer.first}, {"compression_ratio", peer.second}};
    }
    const double seg_ms = opt.segments > 1 ? time_segments(w, q, compressed, S, opt) : 0;
    if (opt.segments > 1) r["segments"] = {{"count", opt.segments}, {"ms", seg_ms}, {"vs_one", seg_ms / (comp_s * 1e3)}};
    rows.push_back(r);
    if (opt.json) continue;
    fmt::print(
        "  {:>7} {:>10.3f} {:>14.3f} {:>7.1f}x {:>11.1f} {:>7.0f}% {:>6.1f}x {:>12.1f} {:>13.3f} "
        "{:>14.3f} {:>14.3f}",
        S, dense_s * 1e3, comp_s * 1e3, dense_s / comp_s, dense_gbps, 100 * dense_gbps / machine.gbps,
        compressed.compression_ratio(), compress_s * 1e3, pre.dense_ms, pre.compressed_ms, pre.keyrope_ms);
    if (!opt.peer.empty())
      fmt::print(" {:>{}.3f} {:>6.1f}x", peer.first, std::max<size_t>(10, opt.peer.size() + 3), peer.second);
    if (opt.segments > 1) fmt::print(" {:>14.3f} {:>8.2f}x", seg_ms, seg_ms / (comp_s * 1e3));
    fmt::print("\n");
  }
  if (opt.json) print_attention_json(rows, machine);
}

struct RopeBenchOptions {
  int64_t seq = 8192, heads = 8, group = 4, dim = 128, clusters = 64;
  double theta = 0.05;
  int threads = 0;
  int reps = 9;
  bool json = false;
};

// Post-RoPE storage (the seed's) vs pre-RoPE storage with RoPE applied in
// attention (the paper's): accuracy against exact attention, and speed.
// One way of storing the keys: its attention error against exact attention,
// its time and dense attention's over the same keys, its ratio.
struct RopeArm {
  const char* label;
  double error = 0, compressed_s = 0, dense_s = 0, ratio = 0;
  nlohmann::json json() const {
    return {{"relative_error", error}, {"compressed_ms", compressed_s * 1e3}, {"dense_ms", dense_s * 1e3},
            {"compression_ratio", ratio}};
  }
};

// Mean over query heads of ||y - exact|| / ||exact||.
double rel_error(const Tensor& y, const std::vector<double>& exact, int64_t Hq, int64_t D) {
  const std::vector<float> v = y.to_f32();
  double sum = 0;
  for (int64_t hq = 0; hq < Hq; ++hq) {
    double e = 0, n = 0;
    for (int64_t d = 0; d < D; ++d) {
      e += (v[hq * D + d] - exact[hq * D + d]) * (v[hq * D + d] - exact[hq * D + d]);
      n += exact[hq * D + d] * exact[hq * D + d];
    }
    sum += std::sqrt(e / n);
  }
  return sum / static_cast<double>(Hq);
}

void run_rope(const RopeBenchOptions& opt) {
  const int64_t H = opt.heads, G = opt.group, Hq = H * G, D = opt.dim, S = opt.seq;
  eval::SyntheticSpec spec;
  spec.B = 1, spec.H = H, spec.S = S, spec.D = D, spec.n_queries = G, spec.clusters = opt.clusters;
  spec.query_position = S - 1;  // attend() places the query at the last cached position
  spec.rope = true;
  const eval::Workload post = eval::make_synthetic(spec);
  spec.rope = false;
  const eval::Workload pre = eval::make_synthetic(spec);
  const TensorView q_post = TensorView::f32(post.Q.data(), {1, Hq, 1, D});
  const TensorView q_pre = TensorView::f32(pre.Q.data(), {1, Hq, 1, D});
  // Exact attention over the post-RoPE keys (identical to RoPE applied to pre-RoPE ones).
  std::vector<double> exact(static_cast<size_t>(Hq * D));
  for (int64_t hq = 0; hq < Hq; ++hq)
    eval::attention_reference(&post.Q[hq * D], &post.K[(hq / G) * S * D], &post.V[(hq / G) * S * D], S, D,
                              &exact[hq * D]);
  AttentionOptions plain, roped;
  plain.threads = roped.threads = opt.threads;
  roped.rope = {true, spec.rope_base, RopeStyle::kNormal, 0, {}};
  AnchorKVConfig cfg;
  cfg.theta = opt.theta;
  cfg.threads = opt.threads;
  AnchorKVConfig at_positions = cfg;  // key residuals coded at their positions (:pre:keyrope)
  at_positions.key_rope = roped.rope;
  AnchorKVCache c_post(cfg), c_pre(cfg), c_keyrope(at_positions);
  FullKVCache f_post, f_pre;
  c_post.update(post.keys(), post.values());
  f_post.update(post.keys(), post.values());
  for (KVCache* c : std::vector<KVCache*>{&c_pre, &c_keyrope, &f_pre}) c->update(pre.keys(), pre.values());
  auto arm = [&](const char* label, const TensorView& q, const KVCache& comp, const KVCache& dense,
                 const AttentionOptions& ao) {
    RopeArm r{label};
    r.error = rel_error(attend(q, comp, ao), exact, Hq, D);
    std::tie(r.dense_s, r.compressed_s) =
        median_pair(opt.reps, [&] { attend(q, dense, ao); }, [&] { attend(q, comp, ao); });
    r.ratio = comp.compression_ratio();
    return r;
  };
  const RopeArm arms[] = {arm("post-RoPE", q_post, c_post, f_post, plain), arm("pre-RoPE", q_pre, c_pre, f_pre, roped),
                          arm(":keyrope", q_pre, c_keyrope, f_pre, roped)};
  const double err_dense_pre = rel_error(attend(q_pre, f_pre, roped), exact, Hq, D);
  if (opt.json) {
    nlohmann::json pre_json = arms[1].json();
    pre_json["dense_relative_error"] = err_dense_pre;
    const nlohmann::json j = {{"benchmark", "rope"}, {"S", S}, {"H", H}, {"Hq", Hq}, {"D", D}, {"theta", opt.theta},
                              {"rope_base", spec.rope_base}, {"clusters", opt.clusters},
                              {"post_rope", arms[0].json()}, {"pre_rope", pre_json},
                              {"pre_rope_keyrope", arms[2].json()}, {"threads", core::resolve_threads(opt.threads)}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  fmt::print("Pre- vs post-RoPE key storage: B=1 H={} Hq={} S={} D={} theta {} (RoPE base {:.0f}), {} threads\n\n",
             H, Hq, S, D, opt.theta, spec.rope_base, core::resolve_threads(opt.threads));
  fmt::print("  {:<10} {:>14} {:>15} {:>10} {:>8}\n", "keys", "rel. error", "compressed ms", "dense ms", "ratio");
  for (const RopeArm& r : arms)
    fmt::print("  {:<10} {:>14.4f} {:>15.3f} {:>10.3f} {:>7.1f}x\n", r.label, r.error, r.compressed_s * 1e3,
               r.dense_s * 1e3, r.ratio);
  fmt::print("\n  (dense fp16 attention with RoPE applied in attention: rel. error {:.2e})\n", err_dense_pre);
}

}  // namespace

void register_bench(CLI::App* bench) {
  auto opt = std::make_shared<Options>();
  CLI::App* att = bench->add_subcommand("attention", "Compressed vs dense fp16 decode attention");
  att->add_option("--seq", opt->seqs, "sequence lengths")->delimiter(',');
  att->add_option("--heads", opt->heads, "KV heads")->check(CLI::Range(1, 256));
  att->add_option("--group", opt->group, "query heads per KV head (GQA)")->check(CLI::Range(1, 64));
  att->add_option("--head-dim", opt->dim, "head dimension")->check(CLI::Range(1, 1024));
  att->add_option("--theta", opt->theta, "AnchorKV theta");
  att->add_option("--metadata", opt->metadata, "AnchorKV metadata layout: seed (16 B/token), compact (8) or tight (4)")
      ->check(CLI::IsMember({"seed", "compact", "tight"}));
  att->add_option("--threads", opt->threads, "threads (0 = all cores)");
  att->add_option("--reps", opt->reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  att->add_option("--peer", opt->peer, "another cache timed on the same layer, e.g. turboquant:k2v2, kivi2 ('' for none)")
      ->check([](const std::string& s) {
        if (!s.empty()) cache::parse_cache_spec(s);
        return std::string();
      });
  att->add_option("--segments", opt->segments,
                  "also time the same tokens held as this many streaming segments (S / N tokens each)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  att->add_flag("--json", opt->json, "print JSON");
  att->callback([opt] { run_attention(*opt); });

  auto ropt = std::make_shared<RopeBenchOptions>();
  CLI::App* rope = bench->add_subcommand("rope", "Pre-RoPE vs post-RoPE key storage: accuracy and speed");
  rope->add_option("--seq", ropt->seq, "sequence length")->check(CLI::Range(2, 1 << 22));
  rope->add_option("--heads", ropt->heads, "KV heads")->check(CLI::Range(1, 256));
  rope->add_option("--group", ropt->group, "query heads per KV head")->check(CLI::Range(1, 64));
  rope->add_option("--head-dim", ropt->dim, "head dimension (even)")->check(CLI::Range(2, 1024));
  rope->add_option("--theta", ropt->theta, "AnchorKV theta");
  rope->add_option("--clusters", ropt->clusters, "token clusters per head in the workload")
      ->check(CLI::Range(1, 1 << 20));
  rope->add_option("--threads", ropt->threads, "threads (0 = all cores)");
  rope->add_option("--reps", ropt->reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  rope->add_flag("--json", ropt->json, "print JSON");
  rope->callback([ropt] { run_rope(*ropt); });
}

}  // namespace anchorkv::cli
