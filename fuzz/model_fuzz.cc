// libFuzzer target for model loading: any bytes must give a model (and its
// tokenizer) or an anchorkv::Error; a loaded small model must run a forward
// pass. Covers what the GGUF reader accepts but the loader must still check
// (architecture keys, head counts, tensor shapes, tokenizer metadata).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "anchorkv/anchorkv.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anchorkv;
  std::unique_ptr<io::GgufFile> f;
  try {
    f = std::make_unique<io::GgufFile>(io::GgufFile::from_memory(data, size, "fuzz.gguf"));
  } catch (const Error&) {
    return 0;
  }
  try {
    const model::Tokenizer tok = model::Tokenizer::from_gguf(*f);
    const std::string text = "Hello, w\xC3\xB6rld 123!\n\xFF";
    const auto ids = tok.encode(text, true);
    (void)tok.decode(ids);
  } catch (const Error&) {
  }
  try {
    const model::LlamaWeights w = model::load_gguf(*f, "fuzz.gguf");
    const auto& c = w.config;
    if (c.dim <= 64 && c.n_layers <= 2 && c.vocab <= 512 && c.hidden <= 256 && c.head_dim <= 64) {
      model::LlamaModel m(
          w, [](int64_t) { return std::make_unique<FullKVCache>(); }, 1);
      m.forward({0, static_cast<int32_t>(c.vocab - 1)});
      m.forward({0});
    }
  } catch (const Error&) {
  }
  return 0;
}
