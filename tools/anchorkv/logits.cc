// `anchorkv logits`: logits of a real model for given token ids, with any cache.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "commands.h"
#include "eval/tasks.h"
#include "eval/compare.h"
#include "model/llama.h"

namespace anchorkv::cli {
namespace {

struct Options {
  std::string model;
  std::vector<int32_t> tokens;
  std::string cache = "full";
  double theta = 0.05;
  int threads = 0;
  bool incremental = false;
  bool json = false;
  model::Activations activations = model::Activations::kInt8;
};

void run(const Options& opt) {
  const model::LlamaWeights w = model::load_model(opt.model);
  model::LlamaModel m = runtime::make_model(w, opt.cache, opt.theta, opt.threads);
  m.set_activations(opt.activations);
  std::vector<float> logits;
  if (opt.incremental) {  // one token at a time (decode path)
    for (int32_t t : opt.tokens) {
      const auto l = m.forward({t});
      logits.insert(logits.end(), l.begin(), l.end());
    }
  } else {
    logits = m.forward(opt.tokens, /*all_logits=*/true);
  }
  const int64_t V = w.config.vocab;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < opt.tokens.size(); ++i)
    rows.push_back(std::vector<float>(logits.begin() + static_cast<long>(i * V),
                                      logits.begin() + static_cast<long>((i + 1) * V)));
  if (opt.json) {
    std::printf("%s\n", nlohmann::json{{"tokens", opt.tokens}, {"logits", rows}}.dump().c_str());
    return;
  }
  for (size_t i = 0; i < opt.tokens.size(); ++i) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[i * V + v] > logits[i * V + best]) best = v;
    std::printf("position %zu token %d -> argmax %lld (logit %.4f)\n", i, opt.tokens[i],
                static_cast<long long>(best), logits[i * V + best]);
  }
}

}  // namespace

void register_logits(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("logits", "Logits of a GGUF / llama2.c model for token ids");
  sub->add_option("--model,-m", opt->model, "model file (.gguf or llama2.c .bin)")->required();
  sub->add_option("--tokens", opt->tokens, "token ids, comma separated")->delimiter(',')->required();
  sub->add_option("--cache", opt->cache, cache_option_help("cache per layer"));
  sub->add_option("--theta", opt->theta, "cache byte budget");
  sub->add_option("--threads", opt->threads, "threads (0 = all cores)");
  sub->add_flag("--incremental", opt->incremental, "feed one token at a time");
  add_matmul_options(sub, &opt->activations);
  sub->add_flag("--json", opt->json, "print {\"tokens\": [...], \"logits\": [[...], ...]}");
  sub->callback([opt] { run(*opt); });
}

}  // namespace anchorkv::cli
