// SentencePiece-style tokenizer from GGUF metadata (tokenizer.ggml.model =
// "llama"): pieces with scores, byte-fallback tokens <0xNN>.
//
// encode: optional space escaping (' ' -> U+2581, plus a leading one) when the
//   vocabulary uses U+2581 at all (or tokenizer.ggml.add_space_prefix says so);
//   split into UTF-8 characters; repeatedly merge the adjacent pair whose
//   concatenation is the highest-scoring vocabulary piece (leftmost on ties);
//   a symbol that is no piece becomes its bytes' <0xNN> tokens.
// decode: pieces joined, U+2581 -> ' ', byte tokens -> raw bytes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace anchorkv::io {
class GgufFile;
}

namespace anchorkv::model {

class Tokenizer {
 public:
  enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types, int32_t bos,
            int32_t eos, int32_t unk, bool escape_spaces);
  // Throws Error(kUnsupported) for tokenizer models other than "llama".
  static Tokenizer from_gguf(const io::GgufFile& f);
  // The byte-level vocabulary of a model without tokenizer data (llama2.c
  // checkpoints here): ids 3 + byte, 1 = BOS, 2 = EOS.
  static Tokenizer bytes(int64_t vocab);

  std::vector<int32_t> encode(const std::string& text, bool add_bos) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;  // one token's text (bytes for byte tokens)
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> index_;
  int32_t byte_token_[256];
  int32_t bos_, eos_, unk_;
  bool escape_spaces_;
};

}  // namespace anchorkv::model
