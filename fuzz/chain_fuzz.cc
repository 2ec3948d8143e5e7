// libFuzzer target for the server's chain restore (runtime::restore_chain and
// block_info, what serve::Engine does with pooled or spilled prefix blocks):
// the blocks of a small random model's streaming prompt, damaged by the input
// (edits to one block, blocks dropped, swapped or repeated, another prompt),
// must be restored and then decode, or be refused with the model unchanged
// and decoding from scratch — never read out of bounds or trust a bad link.
//
// Input: byte 0 picks the block edited, byte 1 the chain's shape (bit 0: the
// first block dropped, bit 1: two blocks swapped, bit 2: the last block
// repeated, bit 3: a prompt whose later tokens differ); then (u16 offset,
// u8 xor) triples edit that block.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "model/llama.h"
#include "tiny_model.h"
#include "runtime/prefix_chain.h"
#include "runtime/session.h"

namespace {

using namespace anchorkv;

constexpr const char* kSpec = "anchorkv_tight:pre:obs:auto:seg16:recent8";
constexpr double kTheta = 0.3;

struct Base {
  model::LlamaWeights weights = fuzz::tiny_weights();
  runtime::PromptCacheKey key{"fuzz-model", kSpec, kTheta};
  std::vector<int32_t> tokens;
  std::vector<runtime::ChainBlock> blocks;
  Base() {
    for (int i = 0; i < 60; ++i) tokens.push_back((i * 7 + 3) % 24);
    model::LlamaModel m = runtime::make_model(weights, kSpec, kTheta, 1);
    const std::vector<float> logits = runtime::prefill_prompt(m, tokens, 16);
    blocks = runtime::chain_blocks(key, m, tokens, {}, logits);
  }
};

const Base& base() {
  static const Base b;
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Base& b = base();
  if (size < 2 || b.blocks.empty()) return 0;
  std::vector<runtime::HeldBlock> chain;
  for (const auto& c : b.blocks) chain.push_back({c.info, std::make_shared<const std::vector<uint8_t>>(c.file)});
  const size_t edited = data[0] % chain.size();
  std::vector<uint8_t> file = *chain[edited].file;
  for (size_t i = 2; i + 3 <= size; i += 3) {
    uint16_t at;
    std::memcpy(&at, data + i, 2);
    file[at % file.size()] ^= data[i + 2];
  }
  (void)runtime::block_info(file.data(), file.size(), "fuzz.akvc", b.key);
  chain[edited].file = std::make_shared<const std::vector<uint8_t>>(std::move(file));
  const uint8_t shape = data[1];
  if ((shape & 1) && chain.size() > 1) chain.erase(chain.begin());
  if ((shape & 2) && chain.size() > 1) std::swap(chain[0], chain[chain.size() - 1]);
  if (shape & 4) chain.push_back(chain.back());
  std::vector<int32_t> prompt = b.tokens;
  prompt.insert(prompt.end(), {5, 6, 7});
  if (shape & 8) prompt[40] = (prompt[40] + 1) % 24;
  model::LlamaModel m = runtime::make_model(b.weights, kSpec, kTheta, 1);
  const runtime::ChainRestored r = runtime::restore_chain(chain, b.key, prompt, m);
  if (r.restored.outcome != runtime::Restore::kUsed && m.position() != 0) __builtin_trap();  // refused: unchanged
  const int64_t have = m.position();
  if (have < static_cast<int64_t>(prompt.size()))
    m.forward(std::vector<int32_t>(prompt.begin() + have, prompt.end()));
  m.forward({1});
  return 0;
}
