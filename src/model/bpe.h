// GPT-2 style byte-level BPE helpers (tokenizer.ggml.model = "gpt2"):
// the byte <-> printable-character map, and the regex pre-tokenizers named
// by tokenizer.ggml.pre, run with ICU's regex engine (\p{L}, \p{N}, \s and
// look-ahead as the reference tokenizers define them).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace anchorkv::model::bpe {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order. Returns the character as UTF-8.
const std::string& byte_to_char(unsigned char b);
// The inverse for one UTF-8 character; -1 if it is not in the map.
int char_to_byte(const std::string& utf8_char);

class PreTokenizer {
 public:
  // `name` is tokenizer.ggml.pre: "default"/"gpt2" (and "" for files without
  // the key), "qwen2" (single digits), "llama-bpe"/"llama3" (digits in runs of
  // up to 3). Throws Error(kUnsupported) for other names.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits text into chunks whose concatenation is text. Valid UTF-8 runs go
  // through the pattern; each byte of an ill-formed sequence is a chunk.
  std::vector<std::string> split(const std::string& text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace anchorkv::model::bpe
