// `anchorkv run` and `anchorkv eval`: real inference with any cache.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "eval/error_analysis.h"
#include "runtime/prompt_cache.h"
#include "eval/tasks.h"
#include "io/gguf.h"
#include "io/kvdump.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "core/mapped_file.h"
#include "model/tokenizer.h"

namespace anchorkv::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool is_gguf(const std::string& p) { return p.size() >= 5 && p.compare(p.size() - 5, 5, ".gguf") == 0; }

std::string read_file(const std::string& path) {
  return std::string(core::MappedFile::open(path, "anchorkv").text());  // regular files only, never a FIFO
}

// Prompt tokens from --prompt / --prompt-file (GGUF tokenizer) or --tokens.
std::vector<int32_t> prompt_tokens(const std::string& model, const std::string& prompt,
                                   const std::string& prompt_file, const std::vector<int32_t>& ids,
                                   const model::Tokenizer* tok) {
  if (!ids.empty()) return ids;
  const std::string text = !prompt_file.empty() ? read_file(prompt_file) : prompt;
  if (!tok)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv",
               "'" + model + "' carries no tokenizer (llama2.c checkpoint): pass token ids with --tokens");
  return tok->encode(text, true);
}

}  // namespace

namespace {

// ---------------------------------------------------------------- run

struct RunOptions {
  std::string model, prompt, prompt_file, cache = "full";
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
Prefill prefill(const RunOptions& o, const model::LlamaWeights& w, const std::vector<int32_t>& prompt,
                model::LlamaModel& m) {
  const auto t0 = Clock::now();
  if (o.prompt_cache.empty()) {
    std::vector<float> logits = m.forward(prompt);
    return {std::move(logits), since(t0), static_cast<int64_t>(prompt.size())};
  }
  const std::string identity = runtime::model_identity(o.model, w);
  runtime::CachedPrefill c = runtime::prefill_through(o.prompt_cache, identity, o.cache, o.theta, prompt, m);
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
  const model::LlamaWeights w = model::load_model(o.model);
  std::unique_ptr<model::Tokenizer> tok;
  if (is_gguf(o.model))
    tok = std::make_unique<model::Tokenizer>(model::Tokenizer::from_gguf(io::GgufFile::open(o.model)));
  const std::vector<int32_t> prompt = prompt_tokens(o.model, o.prompt, o.prompt_file, o.tokens, tok.get());
  model::LlamaModel m = runtime::make_model(w, o.cache, o.theta, o.threads);
  m.set_activations(o.activations);
  model::Sampler sampler(o.sampler);
  Prefill pre = prefill(o, w, prompt, m);
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

// ---------------------------------------------------------------- bench runtime

struct RuntimeBenchOptions {
  std::string model, text;
  int64_t ctx = 1024, n = 128;
  std::vector<std::string> caches = {"full",         "anchorkv", "anchorkv_compact", "anchorkv:pre", "snapkv",
                                     "streamingllm", "kivi2"};
  double theta = 0.1;
  int reps = 3, threads = 0;
  std::string json_path;
  model::Activations activations = model::Activations::kInt8;
};

// Prefill and greedy-decode speed with each cache, caches interleaved within
// each repetition (same machine state), medians over repetitions.
void bench_runtime(const RuntimeBenchOptions& o) {
  const model::LlamaWeights w = model::load_model(o.model);
  std::vector<int32_t> prompt;
  if (!o.text.empty()) {
    if (!is_gguf(o.model))
      core::fail(ErrorCode::kInvalidArgument, "anchorkv bench runtime", "--text needs a GGUF tokenizer");
    prompt = model::Tokenizer::from_gguf(io::GgufFile::open(o.model)).encode(read_file(o.text), true);
  }
  core::Rng rng(7);
  while (static_cast<int64_t>(prompt.size()) < o.ctx)  // pad (or fill) with seeded random tokens
    prompt.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(w.config.vocab)));
  prompt.resize(static_cast<size_t>(o.ctx));
  for (const auto& c : o.caches) cache::parse_cache_spec(c);
  struct Sample {
    std::vector<double> prefill, decode, first_ms;  // first_ms: the first decode step after the prompt
    double ratio = 1;
    int64_t bytes = 0, full = 0;
  };
  std::map<std::string, Sample> samples;
  const bool tty = isatty(fileno(stderr));
  for (int rep = 0; rep < o.reps; ++rep)
    for (const auto& c : o.caches) {
      model::LlamaModel m = runtime::make_model(w, c, o.theta, o.threads);
      m.set_activations(o.activations);
      auto t0 = Clock::now();
      std::vector<float> logits = m.forward(prompt);
      const double pre_s = since(t0);
      const runtime::CacheTotals t = runtime::cache_totals(m);
      t0 = Clock::now();
      double first_s = 0;
      for (int64_t i = 0; i < o.n; ++i) {
        const auto next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = m.forward({next});
        if (i == 0) first_s = since(t0);
      }
      const double dec_s = since(t0);
      Sample& s = samples[c];
      s.first_ms.push_back(1e3 * first_s);
      s.prefill.push_back(static_cast<double>(o.ctx) / pre_s);
      s.decode.push_back(static_cast<double>(o.n) / std::max(dec_s, 1e-9));
      s.bytes = t.bytes;
      s.full = t.full;
      s.ratio = t.bytes > 0 ? static_cast<double>(t.full) / static_cast<double>(t.bytes) : 1.0;
      if (tty) std::fprintf(stderr, "[rep %d/%d] %-24s\r", rep + 1, o.reps, c.c_str());
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  fmt::print(
      "{}: prompt {} tokens, {} greedy decode steps, theta {}, {} threads, {} activations, median of {}\n\n",
      o.model, o.ctx, o.n, o.theta, core::resolve_threads(o.threads),
      o.activations == model::Activations::kInt8 ? "int8" : "f32", o.reps);
  fmt::print("  {:<21} {:>9} {:>9} {:>13} {:>9} {:>12} {:>9} {:>13}\n", "cache", "KV MiB", "ratio", "prefill t/s",
             "vs full", "decode t/s", "vs full", "1st step ms");
  const double full_pre = samples.count("full") ? median(samples["full"].prefill) : 0;
  const double full_dec = samples.count("full") ? median(samples["full"].decode) : 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : o.caches) {
    const Sample& s = samples[c];
    const double p = median(s.prefill), d = median(s.decode), first = median(s.first_ms);
    fmt::print("  {:<21} {:>9.2f} {:>8.2f}x {:>13.1f} {:>9} {:>12.1f} {:>9} {:>13.2f}\n", c,
               static_cast<double>(s.bytes) / (1 << 20), s.ratio, p,
               full_pre > 0 ? fmt::format("{:.2f}x", p / full_pre) : "-", d,
               full_dec > 0 ? fmt::format("{:.2f}x", d / full_dec) : "-", first);
    rows.push_back({{"cache", c},
                    {"compression_ratio_after_prefill", s.ratio},
                    {"bytes_after_prefill", s.bytes},
                    {"fp16_bytes_every_layer_every_position", s.full},
                    {"prefill_tok_s", p},
                    {"decode_tok_s", d},
                    {"first_decode_step_ms", first},
                    {"prefill_samples", s.prefill},
                    {"decode_samples", s.decode}});
  }
  int64_t local = 0;
  for (int64_t l = 0; l < w.config.n_layers; ++l) local += w.config.is_local(l);
  if (local > 0 && !samples.empty())
    fmt::print("\n  {} of {} layers attend a {}-position window and hold it as a ring (any cache); every layer\n"
               "  holding every position in fp16 would take {:.2f} MiB (ratio column: against that)\n",
               local, w.config.n_layers, w.config.sliding_window,
               static_cast<double>(samples.begin()->second.full) / (1 << 20));
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << nlohmann::json{{"model", o.model},
                        {"local_layers", local},
                        {"sliding_window", w.config.sliding_window},
                        {"prompt_tokens", o.ctx},
                        {"decode_tokens", o.n},
                        {"theta", o.theta},
                        {"threads", core::resolve_threads(o.threads)},
                        {"reps", o.reps},
                        {"activations", o.activations == model::Activations::kInt8 ? "int8" : "f32"},
                        {"results", rows}}
             .dump(2);
  }
}

// ---------------------------------------------------------------- eval

struct EvalOptions {
  std::string model, text, json_path, task = "perplexity";
  std::vector<int32_t> tokens;
  std::vector<int64_t> ctxs = {512};
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int trials = 3;
  int64_t passage = 128;  // copy task
  int questions = 8;      // multiquery task
  double prefix_frac = 0.5;
  std::vector<std::string> caches = {"full", "anchorkv", "snapkv", "h2o", "streamingllm", "kivi2"};
  std::vector<double> thetas = {0.05, 0.1, 0.2};
  int threads = 0;
  std::string prompt_cache;  // file stem: one prompt cache per (cache, theta) for the prefix
};

void evaluate(const EvalOptions& o) {
  const model::LlamaWeights w = model::load_model(o.model);
  const bool copy = o.task == "copy";
  std::vector<int32_t> toks = o.tokens;
  if (toks.empty() || copy) {
    if (!is_gguf(o.model))
      core::fail(ErrorCode::kInvalidArgument, "anchorkv eval",
                 copy ? "the copy task needs a GGUF model (a tokenizer)"
                      : "llama2.c checkpoints carry no tokenizer: pass --tokens");
    if (o.text.empty())
      core::fail(ErrorCode::kInvalidArgument, "anchorkv eval", "pass --text FILE (or --tokens)");
    const model::Tokenizer tok = model::Tokenizer::from_gguf(io::GgufFile::open(o.model));
    toks = tok.encode(read_file(o.text), !copy);
    if (copy) {
      const eval::CopyPrompt c = eval::copy_prompt(tok, toks, o.ctxs[0], o.passage);
      toks = c.tokens;
    }
  }
  if (static_cast<int64_t>(toks.size()) > o.ctxs[0]) toks.resize(static_cast<size_t>(o.ctxs[0]));
  const int64_t N = static_cast<int64_t>(toks.size());
  const int64_t P = copy ? N - o.passage
                         : std::clamp<int64_t>(static_cast<int64_t>(std::llround(o.prefix_frac * N)), 2, N - 1);
  if (N < 3) core::fail(ErrorCode::kInvalidArgument, "anchorkv eval", "need at least 3 tokens of text");
  const bool tty = isatty(fileno(stderr));
  const auto runs = eval::cache_runs(o.caches, o.thetas);
  eval::PrefixFiles files;
  if (!o.prompt_cache.empty()) files = {o.prompt_cache, runtime::model_identity(o.model, w)};
  const eval::PrefixFiles* pf = o.prompt_cache.empty() ? nullptr : &files;
  const eval::Continuation ref = eval::continuation(w, toks, P, "full", 0, o.threads, pf);
  if (copy)
    fmt::print("{}: copy task, a {}-token passage, filler, then the passage again ({} tokens); the repeat is "
               "scored after a compressed prefix of {} tokens\n\n",
               o.model, o.passage, N, P);
  else
    fmt::print(
        "{}: {} tokens, compressed prefix {} tokens, {} continuation tokens scored against the full cache\n\n",
        o.model, N, P, N - P);
  fmt::print("  {:<30} {:>5} {:>9} {:>7} {:>11} {:>9} {:>10} {:>12} {:>11}\n", "cache", "theta", "ratio",
             "ppl", "KL (nats)", "top-1", "bits/tok", "prefill t/s", "decode t/s");
  nlohmann::json rows = nlohmann::json::array();
  int done = 0;
  for (const auto& [cache, theta] : runs) {
    const eval::Continuation c =
        cache == "full" ? ref : eval::continuation(w, toks, P, cache, theta, o.threads, pf);
    const eval::ContinuationScore sc = eval::score_continuation(ref, c, toks, P);
    const double ratio = c.bytes.ratio();
    const int64_t prefilled = P - c.prefix_from_file;  // 0 when the prefix came from a prompt cache
    const double prefill_tok_s = prefilled > 0 ? static_cast<double>(prefilled) / c.prefill_s : 0.0;
    const double decode_tok_s = static_cast<double>(sc.n - 1) / std::max(c.decode_s, 1e-9);
    fmt::print("  {:<30} {:>5} {:>8.2f}x {:>7.3f} {:>11.5f} {:>8.1f}% {:>10.4f} {:>12.1f} {:>11.1f}\n", cache,
               theta > 0 ? fmt::format("{}", theta) : "-", ratio, sc.perplexity, sc.kl_mean, 100.0 * sc.top1,
               sc.bits_per_token, prefill_tok_s, decode_tok_s);
    rows.push_back({{"cache", cache},
                    {"theta", theta},
                    {"compression_ratio_after_prefix", ratio},
                    {"perplexity", sc.perplexity},
                    {"kl_mean", sc.kl_mean},
                    {"top1_agreement", sc.top1},
                    {"prefill_tok_s", prefill_tok_s},
                    {"prefix_from_file", c.prefix_from_file},
                    {"decode_tok_s", decode_tok_s}});
    if (tty) std::fprintf(stderr, "[%d/%zu]\r", ++done, runs.size());
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    nlohmann::json j{{"model", o.model}, {"task", o.task}, {"tokens", N}, {"prefix", P}, {"results", rows}};
    if (copy) j["passage"] = o.passage;
    f << j.dump(2);
  }
}

// Passkey retrieval accuracy per cache and context length (eval/tasks.h).
void passkey(const EvalOptions& o) {
  if (!is_gguf(o.model))
    core::fail(ErrorCode::kInvalidArgument, "anchorkv eval", "passkey needs a GGUF model (a tokenizer)");
  const model::LlamaWeights w = model::load_model(o.model);
  const model::Tokenizer tok = model::Tokenizer::from_gguf(io::GgufFile::open(o.model));
  const auto runs = eval::cache_runs(o.caches, o.thetas);
  const std::vector<eval::PasskeyTrial> trials = eval::passkey_trials(tok, o.ctxs, o.depths, o.trials);
  fmt::print("{}: passkey retrieval, {} trials per (context, depth), greedy answer of 8 tokens\n\n", o.model,
             o.trials);
  std::string head = fmt::format("  {:<21} {:>5}", "cache", "theta");
  for (int64_t ctx : o.ctxs) head += fmt::format(" {:>9}", fmt::format("ctx {}", ctx));
  fmt::print("{}\n", head);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [cache, theta] : runs) {
    std::map<int64_t, std::pair<int, int>> acc;  // ctx -> (correct, total)
    for (const eval::PasskeyTrial& t : trials) {
      acc[t.ctx].first += eval::passkey_answered(w, tok, t, cache, theta, o.threads);
      acc[t.ctx].second += 1;
    }
    std::string line = fmt::format("  {:<21} {:>5}", cache, theta > 0 ? fmt::format("{}", theta) : "-");
    nlohmann::json per_ctx;
    for (int64_t ctx : o.ctxs) {
      const double a = static_cast<double>(acc[ctx].first) / std::max(1, acc[ctx].second);
      line += fmt::format(" {:>8.0f}%", 100 * a);
      per_ctx[std::to_string(ctx)] = a;
    }
    fmt::print("{}\n", line);
    rows.push_back({{"cache", cache}, {"theta", theta}, {"accuracy", per_ctx}});
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << nlohmann::json{{"model", o.model},
                        {"task", "passkey"},
                        {"trials", o.trials},
                        {"depths", o.depths},
                        {"results", rows}}
             .dump(2);
  }
}

// Several questions answered from one compressed prefix (eval/tasks.h).
void multi_query(const EvalOptions& o) {
  if (!is_gguf(o.model))
    core::fail(ErrorCode::kInvalidArgument, "anchorkv eval", "multiquery needs a GGUF model (a tokenizer)");
  const model::LlamaWeights w = model::load_model(o.model);
  const model::Tokenizer tok = model::Tokenizer::from_gguf(io::GgufFile::open(o.model));
  const auto runs = eval::cache_runs(o.caches, o.thetas);
  std::vector<eval::MultiQueryPrompt> prompts;
  for (int t = 0; t < o.trials; ++t)
    prompts.push_back(eval::multi_query_prompt(tok, o.ctxs[0], o.questions, 2026 + static_cast<uint64_t>(t)));
  std::vector<eval::MultiQueryRun> refs;
  for (const auto& p : prompts) refs.push_back(eval::multi_query(w, p, "full", 0, o.threads, nullptr));
  fmt::print("{}: {} prompts of {} tokens, {} questions each at depths spread over the prefix, answered one "
             "after another from one compressed prefix (answers teacher-forced)\n\n",
             o.model, o.trials, prompts[0].prefix.size(), o.questions);
  fmt::print("  {:<30} {:>5} {:>9} {:>11} {:>11} {:>9}\n", "cache", "theta", "ratio", "answer NLL", "KL (nats)",
             "exact");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [cache, theta] : runs) {
    double nll = 0, kl = 0, ratio = 0;
    int exact = 0, n = 0;
    nlohmann::json answers = nlohmann::json::array();
    for (size_t t = 0; t < prompts.size(); ++t) {
      const eval::MultiQueryRun r =
          cache == "full" ? refs[t] : eval::multi_query(w, prompts[t], cache, theta, o.threads, &refs[t]);
      ratio += r.bytes.ratio() / static_cast<double>(prompts.size());
      for (const auto& a : r.answers) {
        nll += a.nll;
        kl += a.kl;
        exact += a.exact;
        ++n;
        answers.push_back({{"prompt", t}, {"depth", a.depth}, {"nll", a.nll}, {"kl", a.kl}, {"exact", a.exact}});
      }
    }
    fmt::print("  {:<30} {:>5} {:>8.2f}x {:>11.4f} {:>11.5f} {:>8.1f}%\n", cache,
               theta > 0 ? fmt::format("{}", theta) : "-", ratio, nll / n, kl / n, 100.0 * exact / n);
    rows.push_back({{"cache", cache},
                    {"theta", theta},
                    {"compression_ratio_after_prefix", ratio},
                    {"answer_nll", nll / n},
                    {"kl_mean", kl / n},
                    {"exact", static_cast<double>(exact) / n},
                    {"answers", answers}});
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << nlohmann::json{{"model", o.model},      {"task", "multiquery"},      {"prompts", o.trials},
                        {"ctx", o.ctxs[0]},      {"questions", o.questions}, {"results", rows}}
             .dump(2);
  }
}

struct AnalyzeOptions {
  std::string model, text, cache = "anchorkv_compact", json_path;
  int64_t ctx = 1024, stride = 1;
  double theta = 0.05, prefix_frac = 0.5;
  int threads = 0;
};

// What the error of one cache is made of, per layer and head (eval/error_analysis.h).
void analyze(const AnalyzeOptions& o) {
  if (!is_gguf(o.model) || o.text.empty())
    core::fail(ErrorCode::kInvalidArgument, "anchorkv analyze", "pass a GGUF model and --text FILE");
  const model::LlamaWeights w = model::load_model(o.model);
  std::vector<int32_t> toks =
      model::Tokenizer::from_gguf(io::GgufFile::open(o.model)).encode(read_file(o.text), true);
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
    f << nlohmann::json{{"model", std::filesystem::path(o.model).filename().string()},
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

struct DumpOptions {
  std::string model, text, out;
  std::vector<int32_t> tokens;
  int64_t ctx = 1024;
  int threads = 0;
};

// One prefill of the text with the full cache, capturing every layer's Q, K
// (before and after RoPE) and V into an .akv file (docs/kvdump.md).
void dump_kv(const DumpOptions& o) {
  const model::LlamaWeights w = model::load_model(o.model);
  std::vector<int32_t> toks = o.tokens;
  if (toks.empty()) {
    if (!is_gguf(o.model) || o.text.empty())
      core::fail(ErrorCode::kInvalidArgument, "anchorkv dump-kv",
                 "pass --text FILE with a GGUF model, or --tokens");
    toks = model::Tokenizer::from_gguf(io::GgufFile::open(o.model)).encode(read_file(o.text), true);
  }
  if (static_cast<int64_t>(toks.size()) > o.ctx) toks.resize(static_cast<size_t>(o.ctx));
  const auto& c = w.config;
  if (!c.rope.freq_scale.empty())
    core::fail(ErrorCode::kUnsupported, "anchorkv dump-kv",
               "the model's RoPE scales its frequencies, which a K/V dump does not record");
  io::KVDump d;
  d.n_heads = static_cast<uint32_t>(c.n_heads);
  d.n_kv_heads = static_cast<uint32_t>(c.n_kv_heads);
  d.head_dim = static_cast<uint32_t>(c.head_dim);
  d.n_tokens = toks.size();
  d.rope_base = c.rope.base;
  d.rope_style = c.rope.style == RopeStyle::kNeox ? 1u : 0u;
  d.layers.resize(static_cast<size_t>(c.n_layers));
  model::LlamaModel m = runtime::make_model(w, "full", 0, o.threads);
  const int64_t T = static_cast<int64_t>(toks.size()), hd = c.head_dim;
  // [T, H, hd] token-major -> [H, T, hd]
  auto head_major = [&](const float* x, int64_t H) {
    std::vector<float> y(static_cast<size_t>(H * T * hd));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) std::copy_n(x + (t * H + h) * hd, hd, &y[(h * T + t) * hd]);
    return y;
  };
  m.set_observer(
      [&](int64_t l, int64_t, const float* q, const float* k_pre, const float* k_post, const float* v) {
        auto& L = d.layers[static_cast<size_t>(l)];
        L.q = head_major(q, c.n_heads);
        L.k_pre = head_major(k_pre, c.n_kv_heads);
        L.k_post = head_major(k_post, c.n_kv_heads);
        L.v = head_major(v, c.n_kv_heads);
      });
  m.forward(toks);
  io::write_kvdump(o.out, d);
  fmt::print("wrote {}: {} layers, {} tokens, {} query heads, {} KV heads, head dim {}\n", o.out, c.n_layers,
             T, c.n_heads, c.n_kv_heads, hd);
}

}  // namespace

void register_runtime(CLI::App& app) {
  auto rb = std::make_shared<RuntimeBenchOptions>();
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* rbc =
      bench->add_subcommand("runtime", "Prefill and decode speed of a real model with each cache");
  rbc->add_option("--model,-m", rb->model, "model file")->required();
  rbc->add_option("--text", rb->text, "prompt text (padded with random tokens to --ctx)");
  rbc->add_option("--ctx", rb->ctx, "prompt tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  rbc->add_option("-n", rb->n, "decode steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  rbc->add_option("--caches", rb->caches, cache_option_help("caches"))->delimiter(',');
  rbc->add_option("--theta", rb->theta, "byte budget of the budgeted caches");
  rbc->add_option("--reps", rb->reps, "repetitions (median)")->check(CLI::Range(1, 100));
  rbc->add_option("--threads", rb->threads, "threads (0 = all cores)");
  rbc->add_option("--json", rb->json_path, "write JSON here");
  add_matmul_options(rbc, &rb->activations);
  rbc->callback([rb] { bench_runtime(*rb); });

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

  auto e = std::make_shared<EvalOptions>();
  CLI::App* ev = app.add_subcommand(
      "eval", "Perplexity, KL and top-1 agreement vs the full cache after a compressed prefix");
  ev->add_option("--model,-m", e->model, "model file")->required();
  ev->add_option("--text", e->text, "text file to score (GGUF models)");
  ev->add_option("--tokens", e->tokens, "token ids to score instead")->delimiter(',');
  ev->add_option("--task", e->task,
                 "perplexity (ppl, KL, top-1 after a compressed prefix), copy (a passage of --text, filler, the "
                 "passage again: loss on the repeat), passkey, or multiquery (--questions facts in one "
                 "compressed prefix, asked one after another; --trials prompts)")
      ->check(CLI::IsMember({"perplexity", "copy", "passkey", "multiquery"}));
  ev->add_option("--questions", e->questions, "multiquery task: facts in the prefix, each asked once")
      ->check(CLI::Range(1, 16));
  ev->add_option("--passage", e->passage, "copy task: passage tokens (the prompt is --ctx tokens in all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 19));
  ev->add_option("--ctx", e->ctxs, "tokens in all (passkey: a list of context lengths)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{3}, int64_t{1} << 20));
  ev->add_option("--depths", e->depths, "passkey depths (0..1)")->delimiter(',');
  ev->add_option("--trials", e->trials, "passkey trials per (context, depth)")->check(CLI::Range(1, 1000));
  ev->add_option("--prefix-frac", e->prefix_frac, "share of the tokens fed as the (compressed) prefill");
  ev->add_option("--caches", e->caches, cache_option_help("caches to compare"))->delimiter(',');
  ev->add_option("--theta", e->thetas, "byte budgets")->delimiter(',');
  ev->add_option("--json", e->json_path, "write JSON here");
  ev->add_option("--threads", e->threads, "threads (0 = all cores)");
  ev->add_option("--prompt-cache", e->prompt_cache,
                 "file stem: the prefix of each (cache, theta) is kept in STEM-CACHE-THETA.akvc and reused");
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
  auto dk = std::make_shared<DumpOptions>();
  CLI::App* dump = app.add_subcommand("dump-kv", "Write every layer's Q/K/V of a prompt to an .akv file");
  dump->add_option("--model,-m", dk->model, "model file")->required();
  dump->add_option("--text", dk->text, "text file (GGUF models)");
  dump->add_option("--tokens", dk->tokens, "token ids instead")->delimiter(',');
  dump->add_option("--ctx", dk->ctx, "tokens at most")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  dump->add_option("--out,-o", dk->out, "output .akv file")->required();
  dump->add_option("--threads", dk->threads, "threads (0 = all cores)");
  dump->callback([dk] { dump_kv(*dk); });

  ev->callback([e] {
    if (e->task == "multiquery")
      multi_query(*e);
    else if (e->task == "passkey")
      passkey(*e);
    else
      evaluate(*e);
  });
}

}  // namespace anchorkv::cli
