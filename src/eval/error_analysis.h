// What a compressed cache's error is made of, per layer and KV head.
//
// The text runs once through the model with the full cache, capturing every
// layer's queries, keys and values. Each layer's prefix (the first P
// positions) is then handed to the cache under study (with the observation
// queries its spec asks for), and every later position's real queries attend
// over the cache's reconstruction of the prefix followed by the exact tokens
// after it (as decode would see them). Per (layer, KV head), averaged over
// those queries and the GQA group's query heads:
//   err          ||y^ - y||^2 / ||y||^2 (compressed keys and values)
//   key_err      the same with only the keys compressed
//   value_err    with only the values compressed
//   unimportant_key_err / important_key_err: only the keys of approximated
//                tokens (no anchor, no key residual) compressed, split by the
//                query's true attention: below the uniform share 1 / n
//                ("unimportant": score errors there steal softmax mass) or
//                at least that share ("important": their detail is lost)
//   approx_mass_true / approx_mass_cache: attention mass on the approximated
//                tokens, exact vs compressed keys (stolen mass when larger)
// and, per layer, the model-level KL (nats, mean over the continuation) when
// that layer alone holds the cache under study and every other layer is exact.
// Only caches that keep every position (AnchorKV) can be analysed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"

namespace anchorkv::eval {

struct HeadErrors {
  int64_t layer = 0, kv_head = 0;
  double err = 0, key_err = 0, value_err = 0, unimportant_key_err = 0, important_key_err = 0;
  double approx_mass_true = 0, approx_mass_cache = 0;
  double approx_share = 0;  // share of the prefix approximated (no anchor, no key residual)
};

struct LayerErrors {
  int64_t layer = 0;
  double kl_alone = 0;   // model KL with only this layer compressed
  HeadErrors mean;       // the layer's heads averaged
};

struct ErrorAnalysis {
  std::vector<HeadErrors> heads;
  std::vector<LayerErrors> layers;
  double kl_all = 0;  // every layer compressed
};

// toks: the text; P: prefix length (compressed); spec: a cache spec
// (cache/registry.h) that keeps every position; `stride`: every stride-th
// later position is a query (1 = all).
ErrorAnalysis analyze_errors(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int64_t P,
                             const std::string& spec, double theta, int threads, int64_t stride = 1);

}  // namespace anchorkv::eval
