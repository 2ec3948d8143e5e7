// `anchorkv demo`: the newcomer's question, answered on a built-in workload —
// how much memory AnchorKV saves and what that costs against what they would
// use otherwise. One synthetic Llama-3-8B-shaped layer held by AnchorKV and by
// its peers at the same bytes (attention error, bytes, speed, best first);
// where a model is at hand (--model, or the shared models beside the
// repository), the same at the model level (KL and top-1 agreement against
// the full cache). Every number printed is measured by this run.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "anchorkv/anchorkv.h"
#include "commands.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "eval/compare.h"
#include "eval/metrics.h"
#include "eval/tasks.h"
#include "eval/workload.h"
#include "inputs.h"
#include "runtime/model_file.h"

namespace anchorkv::cli {

namespace {

struct DemoOptions {
  eval::SyntheticSpec spec;
  AnchorKVConfig config;
  std::string scale = "rms";
  std::string allocation = "pooled";
  std::string metadata = "tight";
  std::string model, text = "tests/data/genesis1.txt";
  bool json = false, no_model = false;
};

// The peers the layer table holds beside AnchorKV, at the same theta.
const std::vector<std::string> kPeers = {"anchorkv_tight:auto", "anchorkv",        "snapkv",
                                         "streamingllm",        "kivi2",           "turboquant:k2v2",
                                         "turboquant:k1v1",     "quantized2",      "quantized4"};
// The model table: AnchorKV's recommended setting and the peers a runtime would use.
const std::vector<std::string> kModelCaches = {"anchorkv_tight:pre:obs:auto", "anchorkv_tight:pre:obs:auto:oneshot",
                                               "anchorkv",   "snapkv:obs",
                                               "streamingllm", "kivi2",
                                               "turboquant:k2v2", "quantized4"};

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

DemoRun measure_demo(const DemoOptions& opt, const eval::Workload& w) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const auto& sp = opt.spec;
  DemoRun r;
  r.cfg = demo_config(opt);
  AnchorKVCache cache(r.cfg);
  auto t0 = Clock::now();
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

// The model-level table: KL and top-1 against the full cache over the
// continuation of the text after a cached prefix of half of it (512 tokens).
struct ModelRow {
  std::string cache;
  // ratio after the prefix, over the session (mean bytes), after the last token
  double ratio = 1, ratio_session = 1, ratio_end = 1, kl = 0, top1 = 0;
};
struct ModelTable {
  std::string model, why_not;  // why_not: set when there is no table
  int64_t tokens = 0, prefix = 0;
  std::vector<ModelRow> rows;
};

ModelTable model_table(const DemoOptions& opt) {
  ModelTable t;
  t.model = !opt.model.empty() ? opt.model : "../shared/models/anchorkv-d128.gguf";
  std::error_code ec;
  if (opt.no_model) return t.why_not = "--no-model", t;
  if (!std::filesystem::is_regular_file(t.model, ec)) return t.why_not = "no model at " + t.model + " (--model)", t;
  if (!std::filesystem::is_regular_file(opt.text, ec)) return t.why_not = "no text at " + opt.text + " (--text)", t;
  const runtime::ModelFile mf = runtime::ModelFile::open(t.model);
  std::vector<int32_t> toks = mf.tok("anchorkv demo").encode(read_file(opt.text), true);
  toks.resize(std::min<size_t>(toks.size(), static_cast<size_t>(std::min<int64_t>(512, mf.weights.config.context))));
  t.tokens = static_cast<int64_t>(toks.size());
  t.prefix = t.tokens / 2;
  if (t.prefix < 2) return t.why_not = "the text is too short", t;
  const int threads = opt.config.threads;
  const eval::Continuation ref = eval::continuation(mf.weights, toks, t.prefix, "full", 0, threads);
  for (const std::string& c : kModelCaches) {
    const eval::Continuation run = eval::continuation(mf.weights, toks, t.prefix, c, opt.config.theta, threads);
    const eval::ContinuationScore sc = eval::score_continuation(ref, run, toks, t.prefix);
    t.rows.push_back({c, run.bytes.ratio(), run.bytes_session.ratio(), run.bytes_end.ratio(), sc.kl_mean, sc.top1});
  }
  std::sort(t.rows.begin(), t.rows.end(), [](const ModelRow& a, const ModelRow& b) { return a.kl < b.kl; });
  return t;
}

nlohmann::json demo_json(const DemoOptions& opt, const DemoRun& r, const std::vector<eval::CompareRow>& layer,
                         const ModelTable& mt) {
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
  j["cosine_similarity"] = r.err.mean_cosine;
  j["fp16_relative_error"] = r.err_fp16.mean;
  j["compress_s"] = st.total_s;
  j["stages_s"] = {{"scores", st.scores_s}, {"anchors", st.anchors_s}, {"assign_utility", st.assign_s},
                   {"allocate", st.allocate_s}, {"encode", st.encode_s}};
  j["threads"] = core::resolve_threads(r.cfg.threads);
  j["simd_target"] = core::simd_target_name();
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& x : layer)
    rows.push_back({{"method", x.method}, {"bytes", x.bytes}, {"compression_ratio", x.compression_ratio},
                    {"tokens_kept", x.tokens_kept}, {"tokens_total", x.tokens_total}, {"relative_error", x.error.mean},
                    {"cosine_similarity", x.error.mean_cosine}, {"compress_ms", x.compress_ms},
                    {"attend_ms", x.attend_ms}});
  j["layer_table"] = rows;
  nlohmann::json model = {{"model", mt.model}};
  if (!mt.why_not.empty()) model["skipped"] = mt.why_not;
  nlohmann::json mrows = nlohmann::json::array();
  for (const auto& x : mt.rows)
    mrows.push_back({{"cache", x.cache}, {"compression_ratio", x.ratio}, {"compression_ratio_at_end", x.ratio_end},
                     {"compression_ratio_session", x.ratio_session},
                     {"kl", x.kl}, {"top1", x.top1}});
  model["tokens"] = mt.tokens;
  model["prefix"] = mt.prefix;
  model["rows"] = mrows;
  j["model_table"] = model;
  return j;
}

void print_layer_table(const DemoOptions& opt, std::vector<eval::CompareRow> rows) {
  const auto& sp = opt.spec;
  std::sort(rows.begin(), rows.end(),
            [](const eval::CompareRow& a, const eval::CompareRow& b) { return a.error.mean < b.error.mean; });
  fmt::print("AnchorKV demo: one synthetic layer shaped like Llama-3-8B's (B={} H={} S={} D={}), every method\n"
             "holding {:.0f}% of the fp16 bytes (theta {}); {} held-out decode queries per head, best first.\n\n",
             sp.B, sp.H, sp.S, sp.D, 100 * opt.config.theta, opt.config.theta, sp.n_queries);
  fmt::print("  {:<20} {:>10} {:>7} {:>13} {:>7} {:>7} {:>9} {:>9}\n", "method", "bytes", "ratio", "tokens kept",
             "error", "cosine", "compr ms", "attend ms");
  for (const auto& x : rows)
    fmt::print("  {:<20} {:>10} {:>6.1f}x {:>13} {:>7.3f} {:>7.3f} {:>9.1f} {:>9.3f}\n", x.method, x.bytes,
               x.compression_ratio, fmt::format("{}/{}", x.tokens_kept, x.tokens_total), x.error.mean,
               x.error.mean_cosine, x.compress_ms, x.attend_ms);
  fmt::print("\n  error: ||y - y_full|| / ||y_full|| of attention over what each cache holds (0 = exact). This\n"
             "  layer is a hard case (64 clusters per head); the model table below is the figure that matters.\n"
             "  Quantizers cannot go below their bits' ratio (kivi2 ~5x, turboquant:k1v1 ~14x at D 128): at 20x only\n"
             "  AnchorKV keeps every token.\n");
}

void print_model_table(const DemoOptions& opt, const ModelTable& mt) {
  if (!mt.why_not.empty()) {
    fmt::print("\nModel level: skipped ({})\n", mt.why_not);
    return;
  }
  fmt::print("\nModel level: {} on {} ({} tokens; the first {} cached, the rest scored), theta {}:\n\n",
             mt.model, opt.text, mt.tokens, mt.prefix, opt.config.theta);
  fmt::print("  {:<36} {:>7} {:>8} {:>7} {:>12} {:>8}\n", "cache", "ratio", "session", "at end", "KL nats/tok",
             "top-1");
  for (const auto& x : mt.rows)
    fmt::print("  {:<36} {:>6.1f}x {:>7.1f}x {:>6.1f}x {:>12.5f} {:>7.1f}%\n", x.cache, x.ratio, x.ratio_session,
               x.ratio_end, x.kl, 100 * x.top1);
  fmt::print("\n  KL(full || cache) per predicted token and top-1 agreement with the full cache (lower KL is\n"
             "  better). ratio: after the cached prefix; session: mean fp16 bytes / mean stored bytes over the\n"
             "  scored tokens; at end: after the last one. AnchorKV streams: the prompt is compressed whole and\n"
             "  decoded tokens close into 128-token segments behind 32 exact ones (:oneshot keeps them exact, as\n"
             "  the seed and SnapKV do, so their ratio falls as a session grows); StreamingLLM evicts to hold its\n"
             "  size; the quantizers code every token. anchorkv_tight:pre:obs:auto is the recommended setting\n"
             "  (README).\n");
}

void run_demo(const DemoOptions& opt) {
  const eval::Workload w = eval::make_synthetic(opt.spec);
  const DemoRun r = measure_demo(opt, w);
  const std::vector<eval::CompareRow> layer = eval::compare(w, {opt.config.theta}, kPeers, opt.config.threads);
  const ModelTable mt = model_table(opt);
  if (opt.json) {
    std::printf("%s\n", demo_json(opt, r, layer, mt).dump(2).c_str());
    return;
  }
  print_layer_table(opt, layer);
  fmt::print("\n  AnchorKV as configured ({}): {} anchors, {} residuals, compressed in {:.1f} ms\n",
             r.cfg.to_string(), r.anchors, r.residuals, r.stats.total_s * 1e3);
  print_model_table(opt, mt);
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
  sub->add_option("--model,-m", opt->model,
                  "GGUF model for the model-level table (default: ../shared/models/anchorkv-d128.gguf when present)");
  sub->add_option("--text", opt->text, "text the model-level table scores");
  sub->add_flag("--no-model", opt->no_model, "the layer table only");
  sub->add_flag("--json", opt->json, "print one JSON object");
  sub->footer(
      "Layer table: every method holds the same bytes (theta of fp16); 'error' is ||y - y_full|| / ||y_full|| of "
      "attention over what the cache holds, for held-out decode queries (0 = exact), 'cosine' its cosine, "
      "'compress ms' the prefill's update, 'attend ms' one decode step's attention on the stored form. "
      "Model table: KL(full || cache) in nats per token and top-1 agreement with the full cache over the "
      "continuation of the text after a cached prefix of half of it.");
  sub->callback([opt] { run_demo(*opt); });
}

}  // namespace anchorkv::cli
