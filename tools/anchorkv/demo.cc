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

void run_demo(const DemoOptions& opt) {
  AnchorKVConfig cfg = opt.config;
  cfg.scale = opt.scale == "absmax" ? ResidualScale::kAbsMax : ResidualScale::kRms;
  cfg.allocation = opt.allocation == "per_head" ? ResidualAllocation::kPerHead : ResidualAllocation::kPooledAcrossHeads;
  cfg.metadata = opt.metadata == "tight"     ? MetadataLayout::kTight
                 : opt.metadata == "compact" ? MetadataLayout::kCompact
                                             : MetadataLayout::kSeed;
  cfg.validate();
  const auto& sp = opt.spec;
  using Clock = std::chrono::steady_clock;

  auto t0 = Clock::now();
  const eval::Workload w = eval::make_synthetic(sp);
  const double gen_s = std::chrono::duration<double>(Clock::now() - t0).count();

  AnchorKVCache cache(cfg);
  t0 = Clock::now();
  KVPair out = cache.update_and_fetch(w.keys(), w.values());
  const double update_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const CompressionStats& st = cache.last_compression_stats();

  // Exact fp16 reference: what a full cache returns for the same tokens.
  FullKVCache full;
  KVPair ref = full.update_and_fetch(w.keys(), w.values());

  const int64_t rows = sp.B * sp.H;
  t0 = Clock::now();
  const std::vector<float> kh = out.keys.to_f32(), vh = out.values.to_f32();
  const std::vector<float> kf = ref.keys.to_f32(), vf = ref.values.to_f32();
  const eval::ErrorSummary err =
      eval::attention_error(w.Q.data(), sp.n_queries, w.K.data(), w.V.data(), kh.data(), vh.data(), rows, sp.S,
                            sp.D, cfg.threads);
  const eval::ErrorSummary err_fp16 =
      eval::attention_error(w.Q.data(), sp.n_queries, w.K.data(), w.V.data(), kf.data(), vf.data(), rows, sp.S,
                            sp.D, cfg.threads);
  const double eval_s = std::chrono::duration<double>(Clock::now() - t0).count();

  const double tok_heads_per_s = static_cast<double>(rows * sp.S) / st.total_s;
  if (opt.json) {
    nlohmann::json j;
    j["workload"] = {{"B", sp.B}, {"H", sp.H}, {"S", sp.S}, {"D", sp.D}, {"queries_per_head", sp.n_queries},
                     {"seed", sp.seed}};
    j["config"] = cfg.to_string();
    j["compression_ratio"] = cache.compression_ratio();
    j["anchorkv_bytes"] = cache.anchorkv_bytes();
    j["full_seq_bytes"] = cache.full_seq_bytes();
    j["tokens_kept"] = cache.tokens_kept();
    j["tokens_total"] = cache.tokens_total();
    j["n_anchor_total"] = cache.n_anchor_total();
    j["n_residual_total"] = cache.n_residual_total();
    j["relative_error"] = err.mean;
    j["relative_error_p95"] = err.p95;
    j["relative_error_aggregate"] = err.aggregate;
    j["cosine_similarity"] = err.mean_cosine;
    j["fp16_relative_error"] = err_fp16.mean;
    j["compress_s"] = st.total_s;
    j["update_and_fetch_s"] = update_s;
    j["stages_s"] = {{"scores", st.scores_s}, {"anchors", st.anchors_s}, {"assign_utility", st.assign_s},
                     {"allocate", st.allocate_s}, {"encode", st.encode_s}};
    j["token_heads_per_s"] = tok_heads_per_s;
    j["threads"] = core::resolve_threads(cfg.threads);
    j["simd_target"] = core::simd_target_name();
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  fmt::print("AnchorKV demo: one synthetic layer B={} H={} S={} D={} ({} held-out queries per head)\n", sp.B, sp.H,
             sp.S, sp.D, sp.n_queries);
  fmt::print("config: {}\n\n", cfg.to_string());
  auto row = [](const std::string& k, const std::string& v) { fmt::print("  {:<34} {}\n", k, v); };
  row("fp16 K+V bytes (full_seq_bytes)", fmt::format("{:>14}", cache.full_seq_bytes()));
  row("stored bytes (anchorkv_bytes)", fmt::format("{:>14}", cache.anchorkv_bytes()));
  row("compression ratio", fmt::format("{:>14.2f}x", cache.compression_ratio()));
  row("tokens kept / total", fmt::format("{:>14}", fmt::format("{} / {}", cache.tokens_kept(), cache.tokens_total())));
  row("anchors (all heads)", fmt::format("{:>14}", cache.n_anchor_total()));
  row("residuals K+V (all heads)", fmt::format("{:>14}", cache.n_residual_total()));
  row("attention rel. error, mean", fmt::format("{:>14.4f}", err.mean));
  row("attention rel. error, p95", fmt::format("{:>14.4f}", err.p95));
  row("attention cosine similarity", fmt::format("{:>14.5f}", err.mean_cosine));
  row("fp16 cache rel. error (reference)", fmt::format("{:>14.6f}", err_fp16.mean));
  row("compression time", fmt::format("{:>12.1f} ms", st.total_s * 1e3));
  row("  scores / anchors+y / assign+util", fmt::format("{:.1f} / {:.1f} / {:.1f} ms", st.scores_s * 1e3,
                                                         st.anchors_s * 1e3, st.assign_s * 1e3));
  row("  allocate / encode", fmt::format("{:.1f} / {:.1f} ms", st.allocate_s * 1e3, st.encode_s * 1e3));
  row("update_and_fetch (incl. dense out)", fmt::format("{:>12.1f} ms", update_s * 1e3));
  row("throughput", fmt::format("{:>12.2f} M token-heads/s", tok_heads_per_s / 1e6));
  row("threads / SIMD target", fmt::format("{} / {}", core::resolve_threads(cfg.threads), core::simd_target_name()));
  fmt::print("\n  (workload generated in {:.0f} ms, error evaluated in {:.0f} ms)\n", gen_s * 1e3, eval_s * 1e3);
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
