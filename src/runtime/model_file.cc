#include "runtime/model_file.h"

#include "core/error.h"
#include "io/gguf.h"
#include "runtime/prompt_cache.h"

namespace anchorkv::runtime {

bool is_gguf_path(const std::string& p) { return p.size() >= 5 && p.compare(p.size() - 5, 5, ".gguf") == 0; }

ModelFile ModelFile::open(const std::string& path) {
  ModelFile m;
  m.path = path;
  if (!is_gguf_path(path)) {
    m.weights = model::load_llama2c(path);
    m.identity = model_identity(path, m.weights);
    return m;
  }
  const io::GgufFile f = io::GgufFile::open(path);
  m.weights = model::load_gguf(f, path);
  m.tokenizer = model::Tokenizer::from_gguf(f);
  if (f.has("tokenizer.chat_template")) m.chat_template = f.get_string("tokenizer.chat_template");
  m.identity = model_identity(f, m.weights);
  return m;
}

const model::Tokenizer& ModelFile::tok(std::string_view op) const {
  if (!tokenizer)
    core::fail(ErrorCode::kInvalidArgument, op,
               "'" + path + "' carries no tokenizer (llama2.c checkpoint): pass token ids with --tokens");
  return *tokenizer;
}

}  // namespace anchorkv::runtime
