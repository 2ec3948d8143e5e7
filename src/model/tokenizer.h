// SentencePiece-style tokenizer from GGUF metadata (tokenizer.ggml.model =
// "llama"): pieces with scores, byte-fallback tokens <0xNN>.
//
// encode: optional space escaping (' ' -> U+2581, plus a leading one) when the
//   vocabulary uses U+2581 at all (or tokenizer.ggml.add_space_prefix says so);
//   split into UTF-8 characters; repeatedly merge the adjacent pair whose
//   concatenation is the highest-scoring vocabulary piece (leftmost on ties);
//   a symbol that is no piece becomes its bytes' <0xNN> tokens.
// decode: pieces joined, U+2581 -> ' ', byte tokens -> raw bytes.
//
// GPT-2 byte-level BPE (tokenizer.ggml.model = "gpt2", with
// tokenizer.ggml.merges "left right" in rank order):
// encode: the pre-tokenizer named by tokenizer.ggml.pre splits the text
//   (model/bpe.h); each chunk's bytes map to GPT-2's printable characters;
//   repeatedly merge the adjacent pair of lowest merge rank (leftmost on
//   ties); each resulting piece is a vocabulary token (a piece that is not
//   falls back to its characters' tokens).
// decode: pieces' characters mapped back to bytes.
//
// BOS is added when encode is asked to and the model's
// tokenizer.ggml.add_bos_token (default: true for llama, false for gpt2) allows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace anchorkv::io {
class GgufFile;
}

namespace anchorkv::model {
namespace bpe {
class PreTokenizer;
}

class Tokenizer {
 public:
  enum TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };

  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
            int32_t bos, int32_t eos, int32_t unk, bool escape_spaces);
  // Byte-level BPE: pieces, merges ("left right", rank order), pre-tokenizer name.
  static Tokenizer byte_level_bpe(std::vector<std::string> pieces, std::vector<int32_t> types,
                                  const std::vector<std::string>& merges, const std::string& pre, int32_t bos,
                                  int32_t eos, int32_t unk);
  // "llama" (SentencePiece) or "gpt2" (byte-level BPE); throws Error(kUnsupported)
  // for other tokenizer models, Error(kCorruptFile) for malformed metadata.
  static Tokenizer from_gguf(const io::GgufFile& f);
  // The byte-level vocabulary of a model without tokenizer data (llama2.c
  // checkpoints here): ids 3 + byte, 1 = BOS, 2 = EOS.
  static Tokenizer bytes(int64_t vocab);

  // Before either algorithm, the text is split at the vocabulary's
  // user-defined tokens (and, with parse_special, its control tokens: the
  // markers of a chat template), longest first, as llama.cpp and the Hugging
  // Face tokenizers do; each becomes its token, the rest is encoded piece by
  // piece (SentencePiece adds its space prefix after each such token).
  // Both algorithms cost O(n log n) in a word's length. `stop`, when given,
  // is asked every few thousand merges and between pre-tokenized chunks;
  // once it answers true, encode throws Error(kCancelled) (a server's
  // request whose deadline passed or whose client left).
  using StopCheck = std::function<bool()>;
  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool parse_special = false,
                              const StopCheck& stop = {}) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;  // one token's text (bytes for byte tokens)
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool adds_bos() const { return add_bos_ && bos_ >= 0; }  // encode(text, true) starts with BOS
  // The control or user-defined token whose text is exactly `text`, or -1.
  int32_t special_token(const std::string& text) const;
  // Whether generation ends at `id`: EOS, EOT (tokenizer.ggml.eot_token_id),
  // or a control token with an end-of-turn text (<|im_end|>, <|eot_id|>,
  // <end_of_turn>, <|end|>, ...), as llama.cpp's end-of-generation set.
  bool ends_generation(int32_t id) const;
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  bool is_bpe() const { return pre_ != nullptr; }

 private:
  std::vector<int32_t> encode_bpe(const std::string& text, const StopCheck& stop) const;
  std::vector<std::string> merge_bpe(const std::string& mapped, const StopCheck& stop) const;  // one chunk's pieces
  std::vector<int32_t> encode_spm(const std::string& text, const StopCheck& stop) const;
  static std::string escape(const std::string& text);  // ' ' -> U+2581
  struct Fragment {
    int32_t token = -1;  // >= 0: a special token; else text
    std::string text;
  };
  std::vector<Fragment> partition(const std::string& text, bool parse_special, const StopCheck& stop) const;
  std::vector<int32_t> specials_;  // control, user-defined and unknown tokens, longest text first
  std::vector<int32_t> end_of_generation_;
  bool rstrip_specials_ = false;   // Phi-3: white space after a special token is dropped
  std::shared_ptr<const bpe::PreTokenizer> pre_;  // set for byte-level BPE
  std::unordered_map<std::string, int32_t> merge_rank_;
  bool byte_encode_ = true;  // BPE over GPT-2's byte characters (not for Gemma 4)
  bool add_bos_ = true;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> index_;
  int32_t byte_token_[256];
  int32_t bos_, eos_, unk_;
  bool escape_spaces_;  // ' ' -> U+2581
  bool space_prefix_;   // a ' ' before the text (SentencePiece's add_space_prefix)
};

}  // namespace anchorkv::model
