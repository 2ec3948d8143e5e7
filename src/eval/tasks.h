// Model-level evaluation tasks on any cache: the continuation after a
// compressed prefix scored against the full cache (perplexity, KL, top-1),
// and passkey retrieval. The CLI only parses flags and prints these.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/registry.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "runtime/session.h"

namespace anchorkv::eval {

using runtime::cache_totals;
using runtime::CacheTotals;
using runtime::make_layer_cache;
using runtime::make_model;

// (cache spec, theta) pairs to run: caches without a byte budget run once
// (theta 0). Every spec is validated before any work starts.
std::vector<std::pair<std::string, double>> cache_runs(const std::vector<std::string>& specs,
                                                       const std::vector<double>& thetas);


// Log-probabilities of every position after a prefix of P tokens: the prefix
// is one prefill (compressed or evicted by the cache), then each later token
// is decoded one at a time.
struct Continuation {
  std::vector<std::vector<double>> logp;  // per predicted position
  double prefill_s = 0, decode_s = 0;     // prefill_s: forward time of the prefix (0 when restored)
  int64_t prefix_from_file = 0;           // prefix tokens restored from a prompt cache
  CacheTotals bytes;                      // right after the prefix
  CacheTotals bytes_end;                  // after the last decoded token (the whole session)
  CacheTotals bytes_session;              // summed over the prefix and every decoded step: its ratio
                                          // is the session's (mean fp16 bytes / mean stored bytes)
};
// Optional prompt-cache files for the prefixes: one file per (spec, theta)
// under `stem` (runtime/prompt_cache.h), trusted only for the model `identity`.
struct PrefixFiles {
  std::string stem, identity;
};
Continuation continuation(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int64_t P,
                          const std::string& spec, double theta, int threads, const PrefixFiles* files = nullptr);

struct ContinuationScore {
  double perplexity = 0, kl_mean = 0, top1 = 0, bits_per_token = 0;
  int64_t n = 0;
};
// Scores `c` on the true next tokens toks[P + i], against the reference `ref`
// (KL(ref || c) in nats, top-1 agreement).
ContinuationScore score_continuation(const Continuation& ref, const Continuation& c,
                                     const std::vector<int32_t>& toks, int64_t P);

// Copy task: BOS, a passage of `passage` tokens from `text` (token ids without
// BOS), filler sentences, then the passage again, `ctx` tokens in all. Scored
// as a continuation (score_continuation) from `prefix` = the position where the
// repeat starts: predicting the repeat needs the passage back from the
// compressed prefix. Throws Error(kInvalidArgument) when ctx cannot hold the
// passage twice or the text is shorter than the passage.
struct CopyPrompt {
  std::vector<int32_t> tokens;
  int64_t prefix = 0;
};
CopyPrompt copy_prompt(const model::Tokenizer& tok, const std::vector<int32_t>& text, int64_t ctx, int64_t passage);

// Multi-query retrieval from one compressed prefix: filler text with n facts
// "The pass key of NAME is KEY." at evenly spread depths, `ctx` tokens in all,
// prefilled once (the cache compresses or evicts it); then each question
// "What is the pass key of NAME? The pass key of NAME is" is fed in turn and
// its answer " KEY." teacher-forced, every question and answer staying in the
// cache after the prefix. Scored per question: the answer's NLL, KL to the
// full cache's answer distributions, and whether every answer token is the
// argmax (exact match under teacher forcing).
struct MultiQueryPrompt {
  std::vector<int32_t> prefix;
  struct Question {
    double depth = 0;
    std::vector<int32_t> question, answer;
  };
  std::vector<Question> questions;  // in the order asked (shuffled depths)
};
MultiQueryPrompt multi_query_prompt(const model::Tokenizer& tok, int64_t ctx, int n_questions, uint64_t seed);

struct AnswerScore {
  double depth = 0;
  double nll = 0;      // mean over the answer's tokens, nats
  double kl = 0;       // mean KL(full || cache) over the answer's tokens (0 for the full cache itself)
  bool exact = false;  // every answer token is the argmax
  std::vector<std::vector<double>> logp;  // per answer token: log-probabilities (for KL)
};
struct MultiQueryRun {
  std::vector<AnswerScore> answers;
  CacheTotals bytes;  // right after the prefix
};
// `ref`: the full cache's run (for KL), or null to score the full cache.
MultiQueryRun multi_query(const model::LlamaWeights& w, const MultiQueryPrompt& p, const std::string& spec,
                          double theta, int threads, const MultiQueryRun* ref);

// A chat over a text: turn after turn, a message of `message` tokens fed as
// a prompt (runtime::prefill_prompt: a streaming cache compresses it whole),
// then an answer of `answer` tokens teacher-forced one at a time and scored,
// every turn staying in the cache for the next. `toks` holds turns * (message
// + answer) tokens at least (BOS first).
struct ChatRun {
  std::vector<std::vector<std::vector<double>>> logp;  // [turn][answer token]: log-probabilities
  std::vector<CacheTotals> bytes;                      // after each turn
  CacheTotals session;                                 // summed after every answer step (session ratio)
};
ChatRun chat(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int turns, int64_t message,
             int64_t answer, const std::string& spec, double theta, int threads);
struct ChatTurnScore {
  double kl = 0, top1 = 0;  // means over the turn's answer tokens
};
// Each turn of `c` against the full cache's run `ref`.
std::vector<ChatTurnScore> score_chat(const ChatRun& ref, const ChatRun& c);

// Passkey retrieval: filler text with "The pass key is N" at a depth, then
// "What is the pass key? The pass key is"; a greedy answer of 8 tokens is
// right when it contains the key.
struct PasskeyTrial {
  int64_t ctx = 0;
  double depth = 0;
  std::string key;
  std::vector<int32_t> prompt;
};
std::vector<PasskeyTrial> passkey_trials(const model::Tokenizer& tok, const std::vector<int64_t>& ctxs,
                                         const std::vector<double>& depths, int trials_per_cell);
bool passkey_answered(const model::LlamaWeights& w, const model::Tokenizer& tok, const PasskeyTrial& trial,
                      const std::string& spec, double theta, int threads);

}  // namespace anchorkv::eval
