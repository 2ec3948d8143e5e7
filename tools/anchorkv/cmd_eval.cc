// `anchorkv eval`: perplexity, KL and top-1 against the full cache, copy, passkey and multi-query tasks.
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
#include "eval/tasks.h"
#include "runtime/model_file.h"

namespace anchorkv::cli {
namespace {

// ---------------------------------------------------------------- eval

struct EvalOptions {
  std::string model, text, json_path, task = "perplexity";
  std::vector<int32_t> tokens;
  std::vector<int64_t> ctxs = {512};
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int trials = 3;
  int64_t passage = 128;  // copy task
  int questions = 8;      // multiquery task
  int turns = 8;          // chat task: turns of --message + --answer tokens
  int64_t message = 64, answer = 48;
  double prefix_frac = 0.5;
  std::vector<std::string> caches = {"full", "anchorkv_tight:pre:obs:auto", "anchorkv", "snapkv:obs", "h2o",
                                     "streamingllm", "kivi2"};
  std::vector<double> thetas = {0.05, 0.1, 0.2};
  int threads = 0;
  std::string prompt_cache;  // file stem: one prompt cache per (cache, theta) for the prefix
};

void evaluate(const EvalOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  const bool copy = o.task == "copy";
  std::vector<int32_t> toks = o.tokens;
  if (toks.empty() || copy) {
    if (o.text.empty())
      core::fail(ErrorCode::kInvalidArgument, "anchorkv eval", "pass --text FILE (or --tokens)");
    const model::Tokenizer& tok = mf.tok("anchorkv eval");
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
  if (!o.prompt_cache.empty()) files = {o.prompt_cache, mf.identity};
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
  size_t width = 30;
  for (const auto& run : runs) width = std::max(width, run.first.size());
  fmt::print("  {:<{}} {:>5} {:>9} {:>9} {:>9} {:>7} {:>11} {:>9} {:>10} {:>12} {:>11}\n", "cache", width, "theta",
             "ratio", "session", "at end", "ppl", "KL (nats)", "top-1", "bits/tok", "prefill t/s", "decode t/s");
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
    fmt::print("  {:<{}} {:>5} {:>8.2f}x {:>8.2f}x {:>8.2f}x {:>7.3f} {:>11.5f} {:>8.1f}% {:>10.4f} {:>12.1f} {:>11.1f}\n",
               cache, width, theta > 0 ? fmt::format("{}", theta) : "-", ratio, c.bytes_session.ratio(), c.bytes_end.ratio(),
               sc.perplexity,
               sc.kl_mean, 100.0 * sc.top1, sc.bits_per_token, prefill_tok_s, decode_tok_s);
    rows.push_back({{"cache", cache},
                    {"theta", theta},
                    {"compression_ratio_after_prefix", ratio},
                    {"compression_ratio_at_end", c.bytes_end.ratio()},
                    {"compression_ratio_session", c.bytes_session.ratio()},
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
    nlohmann::json j{{"model", model_name(o.model)}, {"task", o.task}, {"tokens", N}, {"prefix", P}, {"results", rows}};
    if (copy) j["passage"] = o.passage;
    f << j.dump(2);
  }
}

// Passkey retrieval accuracy per cache and context length (eval/tasks.h).
void passkey(const EvalOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  const model::Tokenizer& tok = mf.tok("anchorkv eval --task passkey");
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
    f << nlohmann::json{{"model", model_name(o.model)},
                        {"task", "passkey"},
                        {"trials", o.trials},
                        {"depths", o.depths},
                        {"results", rows}}
             .dump(2);
  }
}

// Several questions answered from one compressed prefix (eval/tasks.h).
void multi_query(const EvalOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  const model::Tokenizer& tok = mf.tok("anchorkv eval --task multiquery");
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
    f << nlohmann::json{{"model", model_name(o.model)},      {"task", "multiquery"},      {"prompts", o.trials},
                        {"ctx", o.ctxs[0]},      {"questions", o.questions}, {"results", rows}}
             .dump(2);
  }
}

// A chat over --text: turns of a message (a prompt) and a scored answer.
void chat(const EvalOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  if (o.text.empty()) core::fail(ErrorCode::kInvalidArgument, "anchorkv eval --task chat", "pass --text FILE");
  const std::vector<int32_t> toks = mf.tok("anchorkv eval --task chat").encode(read_file(o.text), true);
  const auto runs = eval::cache_runs(o.caches, o.thetas);
  const eval::ChatRun ref = eval::chat(mf.weights, toks, o.turns, o.message, o.answer, "full", 0, o.threads);
  fmt::print("{}: {} turns of a {}-token message (a prompt) and a {}-token answer scored against the full cache\n\n",
             o.model, o.turns, o.message, o.answer);
  size_t width = 30;
  for (const auto& run : runs) width = std::max(width, run.first.size());
  fmt::print("  {:<{}} {:>5} {:>9} {:>9} {:>11} {:>9} {:>12} {:>12}\n", "cache", width, "theta", "session", "at end",
             "KL (nats)", "top-1", "KL turn 1", "KL last turn");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [cache, theta] : runs) {
    const eval::ChatRun c =
        cache == "full" ? ref : eval::chat(mf.weights, toks, o.turns, o.message, o.answer, cache, theta, o.threads);
    const std::vector<eval::ChatTurnScore> turns = eval::score_chat(ref, c);
    double kl = 0, top1 = 0;
    nlohmann::json per_turn = nlohmann::json::array();
    for (size_t t = 0; t < turns.size(); ++t) {
      kl += turns[t].kl / static_cast<double>(turns.size());
      top1 += turns[t].top1 / static_cast<double>(turns.size());
      per_turn.push_back({{"kl", turns[t].kl}, {"top1", turns[t].top1}, {"compression_ratio", c.bytes[t].ratio()}});
    }
    fmt::print("  {:<{}} {:>5} {:>8.2f}x {:>8.2f}x {:>11.5f} {:>8.1f}% {:>12.5f} {:>12.5f}\n", cache, width,
               theta > 0 ? fmt::format("{}", theta) : "-", c.session.ratio(), c.bytes.back().ratio(), kl, 100 * top1,
               turns.front().kl, turns.back().kl);
    rows.push_back({{"cache", cache}, {"theta", theta}, {"compression_ratio_session", c.session.ratio()},
                    {"compression_ratio_at_end", c.bytes.back().ratio()}, {"kl_mean", kl}, {"top1_agreement", top1},
                    {"turns", per_turn}});
  }
  if (!o.json_path.empty())
    std::ofstream(o.json_path) << nlohmann::json{{"model", model_name(o.model)}, {"task", "chat"}, {"turns", o.turns},
                                                 {"message", o.message}, {"answer", o.answer}, {"results", rows}}
                                      .dump(2);
}

}  // namespace

void register_eval(CLI::App& app) {
  auto e = std::make_shared<EvalOptions>();
  CLI::App* ev = app.add_subcommand(
      "eval", "Perplexity, KL and top-1 agreement vs the full cache after a compressed prefix");
  ev->add_option("--model,-m", e->model, "model file")->required();
  ev->add_option("--text", e->text, "text file to score (GGUF models)");
  ev->add_option("--tokens", e->tokens, "token ids to score instead")->delimiter(',');
  ev->add_option("--task", e->task,
                 "perplexity (ppl, KL, top-1 after a compressed prefix), copy (a passage of --text, filler, the "
                 "passage again: loss on the repeat), passkey, multiquery (--questions facts in one "
                 "compressed prefix, asked one after another; --trials prompts), or chat (--turns of a --message "
                 "fed as a prompt and an --answer scored, all of --text; the whole session through the cache)")
      ->check(CLI::IsMember({"perplexity", "copy", "passkey", "multiquery", "chat"}));
  ev->add_option("--turns", e->turns, "chat task: turns")->check(CLI::Range(1, 1000));
  ev->add_option("--message", e->message, "chat task: tokens of each turn's message (fed as a prompt)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  ev->add_option("--answer", e->answer, "chat task: tokens of each turn's answer (scored one at a time)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
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
  ev->callback([e] {
    if (e->task == "multiquery")
      multi_query(*e);
    else if (e->task == "chat")
      chat(*e);
    else if (e->task == "passkey")
      passkey(*e);
    else
      evaluate(*e);
  });
}

}  // namespace anchorkv::cli
