// A Llama-family model (GGUF or llama2.c) whose every layer runs on a chosen
// KV cache: the part of the runtime a program links as anchorkv::runtime.
//
//   auto rt = anchorkv::Runtime::load("model.gguf", "anchorkv_compact:pre", 0.05);
//   std::vector<float> logits = rt.prefill(rt.tokenize("In the beginning"));
//   logits = rt.forward({next_token});   // one decode step
//
// Cache names are those `anchorkv eval --help` lists (full, anchorkv,
// anchorkv_compact, snapkv, kivi2, ...) with optional modifiers: ":pre"
// stores keys before RoPE, ":obs" hands the cache the prompt's real queries,
// ":auto" lets AnchorKV choose its anchor count (e.g. "anchorkv_compact:pre:obs:auto").
// AnchorKV streams (docs/spec.md §4.8): a session stays compressed as it
// grows, segments of 128 tokens closing behind 32 exact ones (":segN:recentM"
// sets them; ":oneshot" is the seed's behaviour, later tokens exact).
// Errors are anchorkv::Error naming the operation. One Runtime is one
// sequence: use it from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace anchorkv {

class Runtime {
 public:
  static Runtime load(const std::string& model_path, const std::string& cache = "full", double theta = 0.05,
                      int threads = 0);
  ~Runtime();
  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;

  // Needs a GGUF model (llama2.c checkpoints carry no tokenizer).
  std::vector<int32_t> tokenize(const std::string& text, bool add_bos = true) const;
  std::string detokenize(const std::vector<int32_t>& tokens) const;
  // Feeds tokens at the next positions; logits of the last one, [vocab].
  std::vector<float> forward(const std::vector<int32_t>& tokens);
  // forward() for a whole prompt (or a chat turn's message), after which a
  // streaming AnchorKV cache compresses every token of it that is still
  // exact: what `run` and `serve` do with a prompt.
  std::vector<float> prefill(const std::vector<int32_t>& prompt);

  int64_t position() const;  // tokens fed so far
  int64_t vocab() const;
  int64_t cache_bytes() const;       // bytes every layer's cache really stores
  int64_t cache_full_bytes() const;  // fp16 K + V bytes for the same tokens

 private:
  struct Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace anchorkv
