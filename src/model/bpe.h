// GPT-2 style byte-level BPE helpers (tokenizer.ggml.model = "gpt2"):
// the byte <-> printable-character map, and the regex pre-tokenizers named
// by tokenizer.ggml.pre, run with ICU's regex engine (\p{L}, \p{N}, \p{P},
// \p{M}, \p{S}, Unicode white space and look-ahead as the reference
// tokenizers define them).
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
  // `name` is tokenizer.ggml.pre (bpe.cc lists the families; "" for files
  // without the key is GPT-2's). Throws Error(kUnsupported) for other names.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits text into chunks whose concatenation is text. Each valid UTF-8 run
  // goes through the family's split patterns in turn, each splitting every
  // chunk of the one before into its matches and the gaps between them (the
  // reference tokenizers' Sequence of Split(Isolated)); each byte of an
  // ill-formed sequence is a chunk of its own.
  std::vector<std::string> split(const std::string& text) const;
  // A chunk that is a vocabulary token is that token, without BPE merges
  // (the reference's ignore_merges: Llama 3 and a few others).
  bool ignore_merges() const { return ignore_merges_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool ignore_merges_ = false;
};

}  // namespace anchorkv::model::bpe
