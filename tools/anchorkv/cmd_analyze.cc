// `anchorkv analyze`: what one cache's error is made of, per layer and head.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/error.h"
#include "inputs.h"
#include "eval/error_analysis.h"
#include "runtime/model_file.h"

namespace anchorkv::cli {
namespace {

struct AnalyzeOptions {
  std::string model, text, cache = "anchorkv_tight:pre:obs:auto", json_path;
  int64_t ctx = 1024, stride = 1;
  double theta = 0.05, prefix_frac = 0.5;
  int threads = 0;
};

// What the error of one cache is made of, per layer and head (eval/error_analysis.h).
void analyze(const AnalyzeOptions& o) {
  if (o.text.empty()) core::fail(ErrorCode::kInvalidArgument, "anchorkv analyze", "pass --text FILE");
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  std::vector<int32_t> toks = mf.tok("anchorkv analyze").encode(read_file(o.text), true);
  if (static_cast<int64_t>(toks.size()) > o.ctx) toks.resize(static_cast<size_t>(o.ctx));
  const int64_t N = static_cast<int64_t>(toks.size());
  const int64_t P = std::clamp<int64_t>(static_cast<int64_t>(std::llround(o.prefix_frac * N)), 2, N - 1);
  const eval::ErrorAnalysis a = eval::analyze_errors(w, toks, P, o.cache, o.theta, o.threads, o.stride);
  fmt::print("{}: {} at theta {}, prefix {} of {} tokens; KL with every layer compressed {:.5f} nats\n\n", o.model,
             o.cache, o.theta, P, N, a.kl_all);
  fmt::print("Attention errors ||y^-y||^2/||y||^2 of the real later queries, and the model KL with one layer "
             "compressed:\n\n");
  fmt::print("  {:>5} {:>4} {:>10} {:>9} {:>9} {:>9} {:>11} {:>10} {:>8} {:>13}\n", "layer", "head", "KL alone", "err",
             "keys", "values", "keys:unimp", "keys:imp", "approx", "mass true/cache");
  auto row = [](const std::string& layer, const std::string& head, const std::string& kl, const eval::HeadErrors& e) {
    fmt::print("  {:>5} {:>4} {:>10} {:>9.5f} {:>9.5f} {:>9.5f} {:>11.5f} {:>10.5f} {:>7.1f}% {:>6.3f}/{:<6.3f}\n",
               layer, head, kl, e.err, e.key_err, e.value_err, e.unimportant_key_err, e.important_key_err,
               100 * e.approx_share, e.approx_mass_true, e.approx_mass_cache);
  };
  nlohmann::json layers = nlohmann::json::array(), heads = nlohmann::json::array();
  auto to_json = [](const eval::HeadErrors& e) {
    return nlohmann::json{{"layer", e.layer},
                          {"kv_head", e.kv_head},
                          {"err", e.err},
                          {"key_err", e.key_err},
                          {"value_err", e.value_err},
                          {"unimportant_key_err", e.unimportant_key_err},
                          {"important_key_err", e.important_key_err},
                          {"approx_share", e.approx_share},
                          {"approx_mass_true", e.approx_mass_true},
                          {"approx_mass_cache", e.approx_mass_cache}};
  };
  for (const auto& le : a.layers) {
    row(std::to_string(le.layer), "all", fmt::format("{:.5f}", le.kl_alone), le.mean);
    nlohmann::json j = to_json(le.mean);
    j.erase("kv_head");
    j["kl_alone"] = le.kl_alone;
    layers.push_back(j);
    for (const auto& e : a.heads)
      if (e.layer == le.layer) {
        row("", std::to_string(e.kv_head), "", e);
        heads.push_back(to_json(e));
      }
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << nlohmann::json{{"model", model_name(o.model)},
                        {"cache", o.cache},
                        {"theta", o.theta},
                        {"tokens", N},
                        {"prefix", P},
                        {"stride", o.stride},
                        {"kl_all", a.kl_all},
                        {"layers", layers},
                        {"heads", heads}}
             .dump(2);
  }
}

}  // namespace

void register_analyze(CLI::App& app) {
  auto an = std::make_shared<AnalyzeOptions>();
  CLI::App* anc = app.add_subcommand(
      "analyze", "What one cache's error is made of: attention errors per layer and head (keys vs values, "
                 "unimportant vs important tokens, stolen softmax mass) and the KL of each layer alone");
  anc->add_option("--model,-m", an->model, "GGUF model")->required();
  anc->add_option("--text", an->text, "text file")->required();
  anc->add_option("--ctx", an->ctx, "tokens in all")->check(CLI::Range(int64_t{3}, int64_t{1} << 20));
  anc->add_option("--prefix-frac", an->prefix_frac, "share of the tokens compressed as the prefix");
  anc->add_option("--cache", an->cache, cache_option_help("the cache to analyse (one that keeps every position)"));
  anc->add_option("--theta", an->theta, "byte budget");
  anc->add_option("--stride", an->stride, "every stride-th later position is a query")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  anc->add_option("--threads", an->threads, "threads (0 = all cores)");
  anc->add_option("--json", an->json_path, "write JSON here");
  anc->callback([an] { analyze(*an); });
}

}  // namespace anchorkv::cli
