// A model file read once: its weights, its tokenizer and chat template (GGUF;
// a llama2.c checkpoint has neither) and its identity, from one read of the
// file. What the CLI, the server and the public Runtime open models with.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/llama.h"
#include "model/tokenizer.h"

namespace anchorkv::runtime {

struct ModelFile {
  std::string path;
  model::LlamaWeights weights;
  std::optional<model::Tokenizer> tokenizer;
  std::string chat_template;  // tokenizer.chat_template, or empty
  std::string identity;       // runtime::model_identity

  // Throws Error (kIo, kCorruptFile, kUnsupported) naming what is wrong.
  static ModelFile open(const std::string& path);
  // The tokenizer; Error(kInvalidArgument) naming `op` for a file without one.
  const model::Tokenizer& tok(std::string_view op) const;
};

bool is_gguf_path(const std::string& path);

}  // namespace anchorkv::runtime
