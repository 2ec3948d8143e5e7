#include "eval/tasks.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cache/registry.h"
#include "runtime/prompt_cache.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/sampler.h"

namespace anchorkv::eval {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}
}  // namespace

std::vector<std::pair<std::string, double>> cache_runs(const std::vector<std::string>& specs,
                                                       const std::vector<double>& thetas) {
  std::vector<std::pair<std::string, double>> runs;
  for (const auto& s : specs) {
    if (cache::parse_cache_spec(s).kind->byte_budgeted)
      for (double th : thetas) runs.emplace_back(s, th);
    else
      runs.emplace_back(s, 0.0);
  }
  return runs;
}

Continuation continuation(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int64_t P,
                          const std::string& spec, double theta, int threads, const PrefixFiles* files) {
  model::LlamaModel m = make_model(w, spec, theta, threads);
  Continuation c;
  const int64_t V = w.config.vocab;
  const std::vector<int32_t> prefix(toks.begin(), toks.begin() + P);
  std::vector<float> logits;
  if (files) {
    runtime::CachedPrefill pre =
        runtime::prefill_through(runtime::prompt_cache_path(files->stem, spec, theta), files->identity, spec, theta,
                                 prefix, m);
    logits = std::move(pre.logits);
    c.prefill_s = pre.forward_s;
    c.prefix_from_file = pre.hit.tokens;
  } else {
    const auto t0 = Clock::now();
    logits = runtime::prefill_prompt(m, prefix);
    c.prefill_s = since(t0);
  }
  c.bytes = c.bytes_session = cache_totals(m);
  double decode_s = 0;
  c.logp.push_back(model::log_softmax(logits.data(), V));
  for (int64_t t = P; t + 1 < static_cast<int64_t>(toks.size()); ++t) {
    const auto t0 = Clock::now();
    logits = m.forward({toks[t]});
    decode_s += since(t0);
    c.logp.push_back(model::log_softmax(logits.data(), V));
    const CacheTotals now = cache_totals(m);
    c.bytes_session.bytes += now.bytes;
    c.bytes_session.full += now.full;
  }
  c.decode_s = decode_s;
  c.bytes_end = cache_totals(m);
  return c;
}

ContinuationScore score_continuation(const Continuation& ref, const Continuation& c,
                                     const std::vector<int32_t>& toks, int64_t P) {
  double nll = 0, kl = 0;
  int64_t agree = 0;
  const int64_t n = static_cast<int64_t>(c.logp.size());
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = ref.logp[i];
    const auto& q = c.logp[i];
    nll -= q[toks[P + i]];
    double k = 0;
    for (size_t v = 0; v < p.size(); ++v) k += std::exp(p[v]) * (p[v] - q[v]);
    kl += k;
    agree += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
  }
  ContinuationScore s;
  s.n = n;
  s.perplexity = std::exp(nll / static_cast<double>(n));
  s.kl_mean = kl / static_cast<double>(n);
  s.top1 = static_cast<double>(agree) / static_cast<double>(n);
  s.bits_per_token = nll / static_cast<double>(n) / std::log(2.0);
  return s;
}

namespace {
const char* const kFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
}  // namespace

CopyPrompt copy_prompt(const model::Tokenizer& tok, const std::vector<int32_t>& text, int64_t ctx, int64_t passage) {
  constexpr const char* op = "anchorkv::eval::copy_prompt";
  if (passage < 1 || 1 + 2 * passage >= ctx)
    core::fail(ErrorCode::kInvalidArgument, op,
               "a passage of " + std::to_string(passage) + " tokens twice does not fit " + std::to_string(ctx) +
                   " tokens with filler between");
  if (static_cast<int64_t>(text.size()) < passage)
    core::fail(ErrorCode::kInvalidArgument, op,
               "the text has " + std::to_string(text.size()) + " tokens, fewer than the passage's " +
                   std::to_string(passage));
  const std::vector<int32_t> filler = tok.encode(kFiller, false);
  CopyPrompt c;
  c.tokens.push_back(tok.bos());
  c.tokens.insert(c.tokens.end(), text.begin(), text.begin() + passage);
  for (size_t i = 0; static_cast<int64_t>(c.tokens.size()) < ctx - passage; ++i)
    c.tokens.push_back(filler[i % filler.size()]);
  c.prefix = static_cast<int64_t>(c.tokens.size());
  c.tokens.insert(c.tokens.end(), text.begin(), text.begin() + passage);
  return c;
}

MultiQueryPrompt multi_query_prompt(const model::Tokenizer& tok, int64_t ctx, int n_questions, uint64_t seed) {
  constexpr const char* op = "anchorkv::eval::multi_query_prompt";
  static const char* const kNames[] = {"Alice", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hiro",
                                       "Ingrid", "Jonas", "Kemal", "Lucia", "Marta", "Nils", "Omar", "Petra"};
  constexpr int kMaxQuestions = static_cast<int>(sizeof(kNames) / sizeof(kNames[0]));
  if (n_questions < 1 || n_questions > kMaxQuestions)
    core::fail(ErrorCode::kInvalidArgument, op, "questions must be in [1, " + std::to_string(kMaxQuestions) + "]");
  core::Rng rng(seed);
  struct Fact {
    std::string name, key;
    std::vector<int32_t> tokens;
  };
  std::vector<Fact> facts;
  int64_t fact_tokens = 0;
  for (int i = 0; i < n_questions; ++i) {
    Fact f{kNames[i], std::to_string(10000 + rng.below(90000)), {}};
    f.tokens = tok.encode("The pass key of " + f.name + " is " + f.key + ". ", false);
    fact_tokens += static_cast<int64_t>(f.tokens.size());
    facts.push_back(std::move(f));
  }
  const std::vector<int32_t> filler = tok.encode(kFiller, false);
  const int64_t filler_total = ctx - 1 - fact_tokens;
  if (filler_total < static_cast<int64_t>(filler.size()))
    core::fail(ErrorCode::kInvalidArgument, op,
               std::to_string(ctx) + " tokens cannot hold " + std::to_string(n_questions) + " facts and filler");
  MultiQueryPrompt p;
  p.prefix.push_back(tok.bos());
  size_t next_filler = 0;
  auto add_filler = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) p.prefix.push_back(filler[next_filler++ % filler.size()]);
  };
  std::vector<double> depth(static_cast<size_t>(n_questions));
  for (int i = 0; i < n_questions; ++i) {
    depth[i] = (i + 0.5) / n_questions;  // fact i sits at this share of the filler
    add_filler(static_cast<int64_t>(std::llround(depth[i] * static_cast<double>(filler_total))) -
               static_cast<int64_t>(next_filler));
    p.prefix.insert(p.prefix.end(), facts[i].tokens.begin(), facts[i].tokens.end());
  }
  add_filler(filler_total - static_cast<int64_t>(next_filler));
  std::vector<int> order(static_cast<size_t>(n_questions));
  for (int i = 0; i < n_questions; ++i) order[i] = i;
  for (int i = n_questions - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
  for (int i : order) {
    MultiQueryPrompt::Question q;
    q.depth = depth[i];
    q.question = tok.encode("What is the pass key of " + facts[i].name + "? The pass key of " + facts[i].name + " is",
                            false);
    q.answer = tok.encode(" " + facts[i].key + ".", false);
    p.questions.push_back(std::move(q));
  }
  return p;
}

MultiQueryRun multi_query(const model::LlamaWeights& w, const MultiQueryPrompt& p, const std::string& spec,
                          double theta, int threads, const MultiQueryRun* ref) {
  model::LlamaModel m = make_model(w, spec, theta, threads);
  const int64_t V = w.config.vocab;
  runtime::prefill_prompt(m, p.prefix);
  MultiQueryRun run;
  run.bytes = cache_totals(m);
  for (size_t qi = 0; qi < p.questions.size(); ++qi) {
    const auto& q = p.questions[qi];
    std::vector<float> logits = m.forward(q.question);
    AnswerScore a;
    a.depth = q.depth;
    a.exact = true;
    for (size_t i = 0; i < q.answer.size(); ++i) {
      const std::vector<double> lp = model::log_softmax(logits.data(), V);
      a.nll -= lp[q.answer[i]];
      a.exact = a.exact && argmax(logits) == q.answer[i];
      if (ref) {
        const auto& rp = ref->answers[qi].logp[i];
        double kl = 0;
        for (int64_t v = 0; v < V; ++v) kl += std::exp(rp[v]) * (rp[v] - lp[v]);
        a.kl += kl;
      }
      a.logp.push_back(lp);
      logits = m.forward({q.answer[i]});
    }
    const double n = static_cast<double>(q.answer.size());
    a.nll /= n;
    a.kl /= n;
    run.answers.push_back(std::move(a));
  }
  return run;
}

std::vector<PasskeyTrial> passkey_trials(const model::Tokenizer& tok, const std::vector<int64_t>& ctxs,
                                         const std::vector<double>& depths, int trials_per_cell) {
  const std::string filler = kFiller;
  const std::string question = "What is the pass key? The pass key is";
  core::Rng rng(2026);
  std::vector<PasskeyTrial> trials;
  const int64_t filler_tokens = static_cast<int64_t>(tok.encode(filler, false).size());
  for (int64_t ctx : ctxs)
    for (double depth : depths)
      for (int t = 0; t < trials_per_cell; ++t) {
        const std::string key = std::to_string(10000 + rng.below(90000));
        const std::string needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
        const int64_t budget = ctx - static_cast<int64_t>(tok.encode(needle + question, false).size()) - 1;
        const int64_t reps = std::max<int64_t>(1, budget / filler_tokens);
        const int64_t at = std::llround(depth * static_cast<double>(reps));
        std::string text;
        for (int64_t r = 0; r < reps; ++r) {
          if (r == at) text += needle;
          text += filler;
        }
        if (at >= reps) text += needle;
        text += question;
        trials.push_back({ctx, depth, key, tok.encode(text, true)});
      }
  return trials;
}

ChatRun chat(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int turns, int64_t message,
             int64_t answer, const std::string& spec, double theta, int threads) {
  if (turns < 1 || message < 1 || answer < 1 || static_cast<int64_t>(toks.size()) < turns * (message + answer))
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::eval::chat",
               std::to_string(turns) + " turns of " + std::to_string(message) + " + " + std::to_string(answer) +
                   " tokens need more than the text's " + std::to_string(toks.size()));
  model::LlamaModel m = make_model(w, spec, theta, threads);
  const int64_t V = w.config.vocab;
  ChatRun run;
  for (int64_t t = 0, pos = 0; t < turns; ++t) {
    std::vector<float> logits = runtime::prefill_prompt(
        m, std::vector<int32_t>(toks.begin() + pos, toks.begin() + pos + message));
    pos += message;
    run.logp.emplace_back();
    for (int64_t i = 0; i < answer; ++i, ++pos) {
      run.logp.back().push_back(model::log_softmax(logits.data(), V));  // predicts toks[pos]
      logits = m.forward({toks[pos]});
      const CacheTotals now = cache_totals(m);
      run.session.bytes += now.bytes;
      run.session.full += now.full;
    }
    run.bytes.push_back(cache_totals(m));
  }
  return run;
}

std::vector<ChatTurnScore> score_chat(const ChatRun& ref, const ChatRun& c) {
  std::vector<ChatTurnScore> out;
  for (size_t t = 0; t < c.logp.size(); ++t) {
    ChatTurnScore s;
    for (size_t i = 0; i < c.logp[t].size(); ++i) {
      const auto& p = ref.logp[t][i];
      const auto& q = c.logp[t][i];
      for (size_t v = 0; v < p.size(); ++v) s.kl += std::exp(p[v]) * (p[v] - q[v]);
      s.top1 += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
    }
    const auto n = static_cast<double>(c.logp[t].size());
    s.kl /= n;
    s.top1 /= n;
    out.push_back(s);
  }
  return out;
}

bool passkey_answered(const model::LlamaWeights& w, const model::Tokenizer& tok, const PasskeyTrial& trial,
                      const std::string& spec, double theta, int threads) {
  model::LlamaModel m = make_model(w, spec, theta, threads);
  std::vector<float> logits = runtime::prefill_prompt(m, trial.prompt);
  std::vector<int32_t> answer;
  for (int i = 0; i < 8; ++i) {
    answer.push_back(argmax(logits));
    logits = m.forward({answer.back()});
  }
  return tok.decode(answer).find(trial.key) != std::string::npos;
}

}  // namespace anchorkv::eval
