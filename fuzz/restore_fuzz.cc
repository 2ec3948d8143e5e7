// libFuzzer target for the server's restore path (runtime::restore_prompt, what
// serve::Engine does with a pooled or spilled prefix): a valid prompt file of
// a small random model, damaged by the input (edits, truncation, its logits
// dropped or cut short, the prompt equal to its tokens or longer), must be
// restored and then decode, or be refused with the model unchanged and
// decoding from scratch — never read out of bounds or use missing logits.
//
// Input: byte 0 picks the variant (bit 0: no logits, bit 1: one logit short,
// bit 2: the prompt is the file's tokens exactly, bit 3: truncate to byte 1's
// share of the file); then (u16 offset, u8 xor) triples edit the file.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "runtime/prompt_cache.h"
#include "eval/tasks.h"
#include "model/llama.h"
#include "tiny_model.h"

namespace {

using namespace anchorkv;

constexpr const char* kSpec = "anchorkv_tight:pre:obs:auto";
constexpr double kTheta = 0.3;

struct Base {
  model::LlamaWeights weights = fuzz::tiny_weights();
  runtime::PromptCacheKey key{"fuzz-model", kSpec, kTheta};
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  model::LlamaModel model = runtime::make_model(weights, kSpec, kTheta, 1);
  Base() {
    for (int i = 0; i < 40; ++i) tokens.push_back((i * 7 + 3) % 24);
    logits = model.forward(tokens);
  }
};

const Base& base() {
  static const Base b;
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Base& b = base();
  const uint8_t variant = size > 0 ? data[0] : 0;
  std::vector<float> logits = b.logits;
  if (variant & 1) logits.clear();
  if ((variant & 2) && !logits.empty()) logits.pop_back();
  std::vector<uint8_t> file = runtime::prompt_file(b.key, b.model, b.tokens, logits);
  if ((variant & 8) && size > 1) file.resize(file.size() * data[1] / 256);
  for (size_t i = 2; i + 3 <= size && !file.empty(); i += 3) {
    uint16_t at;
    std::memcpy(&at, data + i, 2);
    file[at % file.size()] ^= data[i + 2];
  }
  std::vector<int32_t> prompt = b.tokens;
  if (!(variant & 4)) prompt.insert(prompt.end(), {5, 6, 7});
  model::LlamaModel m = runtime::make_model(b.weights, kSpec, kTheta, 1);
  const runtime::Restored r = runtime::restore_prompt(file.data(), file.size(), "fuzz.akvc", b.key, prompt, m);
  // Used or not, the model must continue: what it holds plus the rest of the prompt, then one step.
  if (r.outcome == runtime::Restore::kUsed && static_cast<size_t>(r.tokens) == prompt.size() &&
      static_cast<int64_t>(r.logits.size()) != b.weights.config.vocab)
    __builtin_trap();  // a full restore must bring the next token's logits
  const int64_t have = m.position();
  if (have < static_cast<int64_t>(prompt.size()))
    m.forward(std::vector<int32_t>(prompt.begin() + have, prompt.end()));
  m.forward({1});
  return 0;
}
