// `anchorkv run` (generation with any cache, --prompt-cache) and `anchorkv tokenize`.
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
#include "model/sampler.h"
#include "runtime/model_file.h"
#include "runtime/prompt_cache.h"
#include "runtime/session.h"

namespace anchorkv::cli {
namespace {

// ---------------------------------------------------------------- run

struct RunOptions {
  std::string model, prompt, prompt_file, cache = "anchorkv_tight:pre:obs:auto";  // the recommended setting
  std::vector<int32_t> tokens;
  double theta = 0.05;
  int64_t n = 128;
  model::SamplerOptions sampler;
  int threads = 0;
  std::string prompt_cache;
  model::Activations activations = model::Activations::kInt8;
};

// The prompt's logits: from a prompt cache when --prompt-cache names one whose
// tokens start the prompt (then only the rest is prefilled), else by a full
// prefill; the file is (re)written whenever tokens were prefilled.
struct Prefill {
  std::vector<float> logits;
  double seconds = 0;     // of the forward pass (not the cache file)
  int64_t prefilled = 0;  // tokens run through the model
};
Prefill prefill(const RunOptions& o, const runtime::ModelFile& mf, const std::vector<int32_t>& prompt,
                model::LlamaModel& m) {
  const auto t0 = Clock::now();
  if (o.prompt_cache.empty()) {
    std::vector<float> logits = runtime::prefill_prompt(m, prompt);
    return {std::move(logits), since(t0), static_cast<int64_t>(prompt.size())};
  }
  runtime::CachedPrefill c = runtime::prefill_through(o.prompt_cache, mf.identity, o.cache, o.theta, prompt, m);
  if (c.hit.used)
    std::fprintf(stderr, "[prompt cache] loaded %lld tokens from %s (%lld bytes on disk) in %.2f ms\n",
                 static_cast<long long>(c.hit.tokens), o.prompt_cache.c_str(),
                 static_cast<long long>(c.hit.file_bytes), c.hit.load_s * 1e3);
  else
    std::fprintf(stderr, "[prompt cache] not used: %s\n", c.hit.why_not.c_str());
  if (c.saved_bytes > 0)
    std::fprintf(stderr, "[prompt cache] saved %zu tokens to %s: %lld bytes on disk in %.2f ms\n",
                 prompt.size(), o.prompt_cache.c_str(), static_cast<long long>(c.saved_bytes),
                 c.save_s * 1e3);
  return {std::move(c.logits), c.forward_s, c.prefilled};
}

void run(const RunOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  const model::Tokenizer* tok = mf.tokenizer ? &*mf.tokenizer : nullptr;
  const std::vector<int32_t> prompt = prompt_tokens(mf, o.prompt, o.prompt_file, o.tokens);
  model::LlamaModel m = runtime::make_model(w, o.cache, o.theta, o.threads);
  m.set_activations(o.activations);
  model::Sampler sampler(o.sampler);
  Prefill pre = prefill(o, mf, prompt, m);
  std::vector<float>& logits = pre.logits;
  auto t0 = Clock::now();
  int64_t generated = 0;
  for (; generated < o.n; ++generated) {
    const int32_t next = sampler.sample(logits.data(), w.config.vocab);
    if (tok && tok->ends_generation(next)) break;
    if (tok)
      std::fputs(tok->piece(next).c_str(), stdout);
    else
      std::printf("%d ", next);
    std::fflush(stdout);
    if (m.position() >= w.config.context && w.config.context > 0) break;
    logits = m.forward({next});
  }
  const double decode_s = since(t0);
  const runtime::CacheTotals t = runtime::cache_totals(m);
  std::fprintf(stderr,
               "\n\n[%s cache] prompt %zu tokens, %lld prefilled: %.1f tok/s; generated %lld tokens: decode "
               "%.1f tok/s\n"
               "[%s cache] stores %lld bytes for %lld fp16 bytes: compression ratio %.2fx\n"
               "[weights] %.1f MiB in memory\n",
               o.cache.c_str(), prompt.size(), static_cast<long long>(pre.prefilled),
               pre.prefilled > 0 ? static_cast<double>(pre.prefilled) / pre.seconds : 0.0,
               static_cast<long long>(generated),
               generated > 0 ? static_cast<double>(generated) / decode_s : 0.0, o.cache.c_str(),
               static_cast<long long>(t.bytes), static_cast<long long>(t.full),
               t.bytes > 0 ? static_cast<double>(t.full) / static_cast<double>(t.bytes) : 1.0,
               static_cast<double>(w.bytes()) / (1024.0 * 1024.0));
}

}  // namespace

void register_run(CLI::App& app) {
  struct TokenizeOptions {
    std::string model, text, text_file;
    bool bos = false, json = false;
  };
  auto tk = std::make_shared<TokenizeOptions>();
  CLI::App* tok_cmd = app.add_subcommand("tokenize", "Token ids of a text with a GGUF model's tokenizer");
  tok_cmd->add_option("--model,-m", tk->model, "GGUF model file")->required();
  auto* text_opt = tok_cmd->add_option("--text,-t", tk->text, "text to tokenize");
  tok_cmd->add_option("--text-file", tk->text_file, "text from a file")->excludes(text_opt);
  tok_cmd->add_flag("--bos", tk->bos, "add BOS where the model's tokenizer asks for one");
  tok_cmd->add_flag("--json", tk->json, "print {\"tokens\": [...], \"pieces\": [...], \"decoded\": ...}");
  tok_cmd->callback([tk] {
    const model::Tokenizer tok = model::Tokenizer::from_gguf(io::GgufFile::open(tk->model));
    const std::string text = tk->text_file.empty() ? tk->text : read_file(tk->text_file);
    const std::vector<int32_t> ids = tok.encode(text, tk->bos);
    if (tk->json) {
      nlohmann::json pieces = nlohmann::json::array();
      // Pieces are raw bytes; a piece that splits a UTF-8 character is shown with replacement characters.
      for (int32_t id : ids) pieces.push_back(tok.piece(id));
      std::printf("%s\n", nlohmann::json{{"tokens", ids}, {"pieces", pieces}, {"decoded", tok.decode(ids)}}
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
    std::printf("\n");
  });

  auto r = std::make_shared<RunOptions>();
  CLI::App* run_cmd = app.add_subcommand("run", "Generate text with a GGUF / llama2.c model and any cache");
  run_cmd->add_option("--model,-m", r->model, "model file")->required();
  run_cmd->add_option("--prompt,-p", r->prompt, "prompt text (GGUF models)");
  run_cmd->add_option("--prompt-file", r->prompt_file, "prompt from a file");
  run_cmd->add_option("--tokens", r->tokens, "prompt as token ids")->delimiter(',');
  run_cmd->add_option("--cache", r->cache, cache_option_help("cache per layer"));
  run_cmd->add_option("--theta", r->theta, "cache byte budget");
  run_cmd->add_option("-n", r->n, "tokens to generate")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  run_cmd->add_option("--temperature", r->sampler.temperature, "0 = greedy");
  run_cmd->add_option("--top-k", r->sampler.top_k, "keep the k most likely (0 = all)");
  run_cmd->add_option("--top-p", r->sampler.top_p, "nucleus mass (1 = all)");
  run_cmd->add_option("--seed", r->sampler.seed, "sampling seed");
  run_cmd->add_option("--threads", r->threads, "threads (0 = all cores)");
  add_matmul_options(run_cmd, &r->activations);
  run_cmd->add_option(
      "--prompt-cache", r->prompt_cache,
      "cache file (docs/cachefile.md): reused when its tokens start the prompt, written otherwise");
  run_cmd->callback([r] { run(*r); });

}

}  // namespace anchorkv::cli
