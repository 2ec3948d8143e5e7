// `anchorkv demo`: compress one synthetic Llama-3-8B-shaped layer and report
// bytes, ratio, anchors, residuals, attention-output error on held-out
// queries, and time. Every number printed is measured by this run.
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "anchorkv/anchorkv.h"
#include "commands.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "eval/metrics.h"
#include "eval/workload.h"

namespace anchorkv::cli {

namespace {

struct DemoOptions {
  eval::SyntheticSpec spec;
  AnchorKVConfig config;
  std::string scale = "rms";
  std::string allocation = "pooled";
  std::string metadata = "seed";
  bool json = false;
};

// Everything the demo prints, measured by one run.
struct DemoRun {
  AnchorKVConfig cfg;
  CompressionStats stats;
  eval::ErrorSummary err, err_fp16;
  double gen_s = 0, update_s = 0, eval_s = 0;
  int64_t full_bytes = 0, bytes = 0, kept = 0, total = 0, anchors = 0, residuals = 0;
  double ratio = 1;
};

AnchorKVConfig demo_config(const DemoOptions& opt) {
  AnchorKVConfig cfg = opt.config;
  cfg.scale = opt.scale == "absmax" ? ResidualScale::kAbsMax : ResidualScale::kRms;
  cfg.allocation = opt.allocation == "per_head" ? ResidualAllocation::kPerHead : ResidualAllocation::kPooledAcrossHeads;
  cfg.metadata = opt.metadata == "tight"     ? MetadataLayout::kTight
                 : opt.metadata == "compact" ? MetadataLayout::kCompact
                                             : MetadataLayout::kSeed;
  cfg.validate();
  return cfg;
}

DemoRun measure_demo(const DemoOptions& opt) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const auto& sp = opt.spec;
  DemoRun r;
  r.cfg = demo_config(opt);
  auto t0 = Clock::now();
  const eval::Workload w = eval::make_synthetic(sp);
  r.gen_s = seconds(t0);
  AnchorKVCache cache(r.cfg);
  t0 = Clock::now();
  const KVPair out = cache.update_and_fetch(w.keys(), w.values());
  r.update_s = seconds(t0);
  r.stats = cache.last_compression_stats();
  FullKVCache full;  // exact fp16 reference: what a full cache returns for the same tokens
  const KVPair ref = full.update_and_fetch(w.keys(), w.values());
  const int64_t rows = sp.B * sp.H;
  t0 = Clock::now();
  const std::vector<float> kh = out.keys.to_f32(), vh = out.values.to_f32();
  const std::vector<float> kf = ref.keys.to_f32(), vf = ref.values.to_f32();
  r.err = eval::attention_error(w.Q.data(), sp.n_queries, w.K.data(), w.V.data(), kh.data(), vh.data(), rows, sp.S,
                                sp.D, r.cfg.threads);
  r.err_fp16 = eval::attention_error(w.Q.data(), sp.n_queries, w.K.data(), w.V.data(), kf.data(), vf.data(), rows,
                                     sp.S, sp.D, r.cfg.threads);
  r.eval_s = seconds(t0);
  r.full_bytes = cache.full_seq_bytes();
  r.bytes = cache.anchorkv_bytes();
  r.kept = cache.tokens_kept();
  r.total = cache.tokens_total();
  r.anchors = cache.n_anchor_total();
  r.residuals = cache.n_residual_total();
  r.ratio = cache.compression_ratio();
  return r;
}

void print_demo_json(const DemoOptions& opt, const DemoRun& r) {
  const auto& sp = opt.spec;
  const CompressionStats& st = r.stats;
  nlohmann::json j;
  j["workload"] = {{"B", sp.B}, {"H", sp.H}, {"S", sp.S}, {"D", sp.D}, {"queries_per_head", sp.n_queries},
                   {"seed", sp.seed}};
  j["config"] = r.cfg.to_string();
  j["compression_ratio"] = r.ratio;
  j["anchorkv_bytes"] = r.bytes;
  j["full_seq_bytes"] = r.full_bytes;
  j["tokens_kept"] = r.kept;
  j["tokens_total"] = r.total;
  j["n_anchor_total"] = r.anchors;
  j["n_residual_total"] = r.residuals;
  j["relative_error"] = r.err.mean;
  j["relative_error_p95"] = r.err.p95;
  j["relative_error_aggregate"] = r.err.aggregate;
  j["cosine_similarity"] = r.err.mean_cosine;
  j["fp16_relative_error"] = r.err_fp16.mean;
  j["compress_s"] = st.total_s;
  j["update_and_fetch_s"] = r.update_s;
  j["stages_s"] = {{"scores", st.scores_s}, {"anchors", st.anchors_s}, {"assign_utility", st.assign_s},
                   {"allocate", st.allocate_s}, {"encode", st.encode_s}};
  j["token_heads_per_s"] = static_cast<double>(sp.B * sp.H * sp.S) / st.total_s;
  j["threads"] = core::resolve_threads(r.cfg.threads);
  j["simd_target"] = core::simd_target_name();
  std::printf("%s\n", j.dump(2).c_str());
}

void print_demo_table(const DemoOptions& opt, const DemoRun& r) {
  const auto& sp = opt.spec;
  const CompressionStats& st = r.stats;
  fmt::print("AnchorKV demo: one synthetic layer B={} H={} S={} D={} ({} held-out queries per head)\n", sp.B, sp.H,
             sp.S, sp.D, sp.n_queries);
  fmt::print("config: {}\n\n", r.cfg.to_string());
  auto row = [](const std::string& k, const std::string& v) { fmt::print("  {:<34} {}\n", k, v); };
  row("fp16 K+V bytes (full_seq_bytes)", fmt::format("{:>14}", r.full_bytes));
  row("stored bytes (anchorkv_bytes)", fmt::format("{:>14}", r.bytes));
  row("compression ratio", fmt::format("{:>14.2f}x", r.ratio));
  row("tokens kept / total", fmt::format("{:>14}", fmt::format("{} / {}", r.kept, r.total)));
  row("anchors (all heads)", fmt::format("{:>14}", r.anchors));
  row("residuals K+V (all heads)", fmt::format("{:>14}", r.residuals));
  row("attention rel. error, mean", fmt::format("{:>14.4f}", r.err.mean));
  row("attention rel. error, p95", fmt::format("{:>14.4f}", r.err.p95));
  row("attention cosine similarity", fmt::format("{:>14.5f}", r.err.mean_cosine));
  row("fp16 cache rel. error (reference)", fmt::format("{:>14.6f}", r.err_fp16.mean));
  row("compression time", fmt::format("{:>12.1f} ms", st.total_s * 1e3));
  row("  scores / anchors+y / assign+util",
      fmt::format("{:.1f} / {:.1f} / {:.1f} ms", st.scores_s * 1e3, st.anchors_s * 1e3, st.assign_s * 1e3));
  row("  allocate / encode", fmt::format("{:.1f} / {:.1f} ms", st.allocate_s * 1e3, st.encode_s * 1e3));
  row("update_and_fetch (incl. dense out)", fmt::format("{:>12.1f} ms", r.update_s * 1e3));
  row("throughput", fmt::format("{:>12.2f} M token-heads/s", static_cast<double>(sp.B * sp.H * sp.S) / st.total_s / 1e6));
  row("threads / SIMD target",
      fmt::format("{} / {}", core::resolve_threads(r.cfg.threads), core::simd_target_name()));
  fmt::print("\n  (workload generated in {:.0f} ms, error evaluated in {:.0f} ms)\n", r.gen_s * 1e3, r.eval_s * 1e3);
}

void run_demo(const DemoOptions& opt) {
  const DemoRun r = measure_demo(opt);
  if (opt.json)
    print_demo_json(opt, r);
  else
    print_demo_table(opt, r);
}

}  // namespace

void register_demo(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* sub = app.add_subcommand("demo", "Compress a built-in synthetic layer (Llama-3-8B shaped) and report");
  sub->add_option("--batch,-B", opt->spec.B, "batch size")->check(CLI::Range(1, 64));
  sub->add_option("--heads,-H", opt->spec.H, "KV heads")->check(CLI::Range(1, 256));
  sub->add_option("--seq,-S", opt->spec.S, "prefill length")->check(CLI::Range(2, 1 << 22));
  sub->add_option("--head-dim,-D", opt->spec.D, "head dimension")->check(CLI::Range(1, 1024));
  sub->add_option("--queries", opt->spec.n_queries, "held-out queries per head")->check(CLI::Range(1, 4096));
  sub->add_option("--workload-seed", opt->spec.seed, "workload seed");
  sub->add_flag("!--no-rope", opt->spec.rope, "do not apply RoPE to the workload's keys and queries");
  sub->add_option("--clusters", opt->spec.clusters, "token clusters per head")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--theta", opt->config.theta, "fraction of fp16 bytes to retain");
  sub->add_option("--window", opt->config.window, "trailing window / proxy queries");
  sub->add_option("--rho", opt->config.rho, "scored share of non-window anchors");
  sub->add_option("--anchor-frac", opt->config.anchor_frac, "anchor budget as a fraction of S");
  sub->add_option("--bits", opt->config.residual_bits, "residual bits per coordinate (1-4)");
  sub->add_option("--seed", opt->config.seed, "AnchorKV seed");
  sub->add_option("--scale", opt->scale, "residual scale: rms or absmax")->check(CLI::IsMember({"rms", "absmax"}));
  sub->add_option("--allocation", opt->allocation, "residual allocation: pooled or per_head")
      ->check(CLI::IsMember({"pooled", "per_head"}));
  sub->add_option("--metadata", opt->metadata, "per-token metadata: seed (16 B), compact (8 B) or tight (4 B)")
      ->check(CLI::IsMember({"seed", "compact", "tight"}));
  sub->add_option("--threads", opt->config.threads, "worker threads (0 = all cores)");
  sub->add_flag("--json", opt->json, "print one JSON object");
  sub->callback([opt] { run_demo(*opt); });
}

}  // namespace anchorkv::cli
