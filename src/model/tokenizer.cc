#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <queue>
#include <string_view>

#include "core/error.h"
#include "io/gguf.h"
#include "model/bpe.h"

namespace anchorkv::model {

namespace {
constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581
constexpr const char* kOp = "anchorkv::Tokenizer";

[[noreturn]] void cancelled() {
  core::fail(ErrorCode::kCancelled, kOp, "tokenizing was stopped (the request's deadline passed or its client left)");
}

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;  // invalid lead byte: a symbol of its own (falls back to a byte token)
}

struct Span {
  uint32_t start, len;
};

// Merges `text`'s UTF-8 characters greedily, the adjacent pair of highest
// `priority(left, right)` first (leftmost on ties; nullopt: no merge), with
// a heap of candidate pairs over a linked list of symbols, as llama.cpp and
// the Hugging Face tokenizers do: each merge costs O(log n) heap work, so a
// long word costs O(n log n) rather than a rescan of every pair per merge. A
// heap entry whose symbols changed since it was pushed is stale and skipped,
// so the merges are those of the rescanning algorithm. `stop` is asked every
// 4096 merges. Returns the final symbols in order.
template <class Priority>
std::vector<Span> merge_symbols(const std::string& text, Priority&& priority, const std::function<bool()>& stop) {
  struct Sym {
    uint32_t start, len;
    int32_t prev, next;
  };
  std::vector<Sym> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t l = std::min(utf8_len(static_cast<unsigned char>(text[i])), text.size() - i);
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(l), n - 1, n + 1});
    i += l;
  }
  if (!sym.empty()) sym.back().next = -1;
  struct Pair {
    double priority;
    int32_t left, right;
    uint32_t len;
    bool operator<(const Pair& o) const {  // the heap's top: highest priority, then leftmost
      return priority != o.priority ? priority < o.priority : left > o.left;
    }
  };
  std::priority_queue<Pair> heap;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view left(text.data() + sym[l].start, sym[l].len), right(text.data() + sym[r].start, sym[r].len);
    if (const std::optional<double> p = priority(left, right)) heap.push({*p, l, r, sym[l].len + sym[r].len});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_pair(static_cast<int32_t>(i) - 1, static_cast<int32_t>(i));
  for (uint32_t merges = 0; !heap.empty(); ++merges) {
    if ((merges & 4095) == 4095 && stop && stop()) cancelled();
    const Pair p = heap.top();
    heap.pop();
    Sym& l = sym[p.left];
    Sym& r = sym[p.right];
    if (l.len == 0 || r.len == 0 || l.next != p.right || l.len + r.len != p.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
  std::vector<Span> out;
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out.push_back({sym[i].start, sym[i].len});
  return out;
}
}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
                     int32_t bos, int32_t eos, int32_t unk, bool escape_spaces)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      bos_(bos),
      eos_(eos),
      unk_(unk),
      escape_spaces_(escape_spaces),
      space_prefix_(escape_spaces) {
  const size_t n = pieces_.size();
  if (scores_.size() != n || types_.size() != n)
    core::fail(ErrorCode::kCorruptFile, kOp, "tokens, scores and token types differ in length");
  for (int32_t id : {bos_, eos_, unk_})
    if (id < -1 || id >= static_cast<int32_t>(n))
      core::fail(ErrorCode::kCorruptFile, kOp,
                 "special token id " + std::to_string(id) + " is outside the vocabulary");
  for (auto& b : byte_token_) b = -1;
  for (size_t i = 0; i < n; ++i) {
    if (types_[i] == kByte) {
      // Exactly "<0xHH>" with two hex digits (anything else is not a byte token).
      const std::string& p = pieces_[i];
      auto hex = [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
               : (ch >= 'A' && ch <= 'F')                   ? ch - 'A' + 10
               : (ch >= 'a' && ch <= 'f')                   ? ch - 'a' + 10
                                                            : -1;
      };
      if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && hex(p[3]) >= 0 && hex(p[4]) >= 0)
        byte_token_[hex(p[3]) * 16 + hex(p[4])] = static_cast<int32_t>(i);
      continue;
    }
    if (types_[i] == kNormal || types_[i] == kUserDefined || types_[i] == kUnused)
      index_.emplace(pieces_[i], static_cast<int32_t>(i));
    if ((types_[i] == kControl || types_[i] == kUserDefined || types_[i] == kUnknown) && !pieces_[i].empty())
      specials_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return pieces_[a].size() > pieces_[b].size(); });
  static const char* const kEndOfTurn[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                           "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"};
  for (int32_t id : specials_)
    for (const char* t : kEndOfTurn)
      if (types_[id] == kControl && pieces_[id] == t) end_of_generation_.push_back(id);
  if (eos_ >= 0) end_of_generation_.push_back(eos_);
}

int32_t Tokenizer::special_token(const std::string& text) const {
  for (int32_t id : specials_)
    if (types_[id] != kUnknown && pieces_[id] == text) return id;
  return -1;
}

bool Tokenizer::ends_generation(int32_t id) const {
  return std::find(end_of_generation_.begin(), end_of_generation_.end(), id) != end_of_generation_.end();
}

Tokenizer Tokenizer::from_gguf(const io::GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "llama" && model != "gpt2" && model != "gemma4")
    core::fail(ErrorCode::kUnsupported, kOp,
               "tokenizer model '" + model + "' is not supported (llama, gpt2, gemma4 are)");
  const auto& toks = f.get_array("tokenizer.ggml.tokens");
  std::vector<std::string> pieces;
  for (const auto& v : toks.items) {
    const auto* s = std::get_if<std::string>(&v);
    if (!s) core::fail(ErrorCode::kCorruptFile, kOp, "tokenizer.ggml.tokens holds a non-string");
    pieces.push_back(*s);
  }
  std::vector<float> scores(pieces.size(), 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    const auto& a = f.get_array("tokenizer.ggml.scores");
    if (a.items.size() != pieces.size())
      core::fail(ErrorCode::kCorruptFile, kOp, "scores and tokens differ in length");
    for (size_t i = 0; i < pieces.size(); ++i)
      if (const auto* d = std::get_if<double>(&a.items[i])) scores[i] = static_cast<float>(*d);
  }
  std::vector<int32_t> types(pieces.size(), kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto& a = f.get_array("tokenizer.ggml.token_type");
    if (a.items.size() != pieces.size())
      core::fail(ErrorCode::kCorruptFile, kOp, "token types and tokens differ in length");
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (const auto* x = std::get_if<int64_t>(&a.items[i])) types[i] = static_cast<int32_t>(*x);
      if (const auto* x = std::get_if<uint64_t>(&a.items[i])) types[i] = static_cast<int32_t>(*x);
    }
  }
  auto id = [&](const char* key, int32_t dflt) {
    return f.has(key) ? static_cast<int32_t>(f.get_uint(key)) : dflt;
  };
  auto flag = [&](const char* key, bool dflt) {
    if (!f.has(key)) return dflt;
    const auto* b = std::get_if<bool>(&f.metadata().at(key));
    if (!b) core::fail(ErrorCode::kCorruptFile, kOp, std::string(key) + " is not a bool");
    return *b;
  };
  if (model == "gpt2" || model == "gemma4") {
    std::vector<std::string> merges;
    if (f.has("tokenizer.ggml.merges"))
      for (const auto& v : f.get_array("tokenizer.ggml.merges").items) {
        const auto* m = std::get_if<std::string>(&v);
        if (!m) core::fail(ErrorCode::kCorruptFile, kOp, "tokenizer.ggml.merges holds a non-string");
        merges.push_back(*m);
      }
    // Gemma 4: BPE merges over UTF-8 text whose spaces are U+2581 (no byte
    // mapping), split only at newlines, <0xNN> tokens for what no merge covers.
    const bool gemma4 = model == "gemma4";
    const std::string pre = gemma4 ? "gemma4" : f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
    Tokenizer t = byte_level_bpe(std::move(pieces), std::move(types), merges, pre,
                                 id("tokenizer.ggml.bos_token_id", -1), id("tokenizer.ggml.eos_token_id", -1),
                                 id("tokenizer.ggml.unknown_token_id", -1));
    t.add_bos_ = flag("tokenizer.ggml.add_bos_token", false);
    if (const int32_t eot = id("tokenizer.ggml.eot_token_id", -1); eot >= 0 && eot < t.size())
      t.end_of_generation_.push_back(eot);
    t.byte_encode_ = !gemma4;
    t.escape_spaces_ = gemma4;
    return t;
  }
  // Spaces are escaped as U+2581 when the vocabulary uses it (a byte-only
  // vocabulary keeps them as bytes); the space prefix follows add_space_prefix
  // (default on; Gemma's vocabularies turn it off).
  bool escape = false;
  for (const auto& p : pieces) escape |= p.find(kSpace) != std::string::npos;
  const bool prefix = flag("tokenizer.ggml.add_space_prefix", true);
  escape = escape || (f.has("tokenizer.ggml.add_space_prefix") && prefix);
  Tokenizer t(std::move(pieces), std::move(scores), std::move(types), id("tokenizer.ggml.bos_token_id", 1),
              id("tokenizer.ggml.eos_token_id", 2), id("tokenizer.ggml.unknown_token_id", 0), escape);
  t.space_prefix_ = escape && prefix;
  t.add_bos_ = flag("tokenizer.ggml.add_bos_token", true);
  if (const int32_t eot = id("tokenizer.ggml.eot_token_id", -1); eot >= 0 && eot < t.size())
    t.end_of_generation_.push_back(eot);
  // llama.cpp strips the white space after Phi-3's special tokens (by model name).
  std::string name = f.has("general.name") ? f.get_string("general.name") : "";
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  t.rstrip_specials_ = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
  return t;
}

Tokenizer Tokenizer::byte_level_bpe(std::vector<std::string> pieces, std::vector<int32_t> types,
                                    const std::vector<std::string>& merges, const std::string& pre,
                                    int32_t bos, int32_t eos, int32_t unk) {
  std::vector<float> scores(pieces.size(), 0.0f);
  Tokenizer t(std::move(pieces), std::move(scores), std::move(types), bos, eos, unk, false);
  t.pre_ = std::make_shared<const bpe::PreTokenizer>(pre);
  t.add_bos_ = false;  // GPT-2 style models add none unless tokenizer.ggml.add_bos_token says so
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos)
      core::fail(ErrorCode::kCorruptFile, kOp,
                 "merge " + std::to_string(r) + " ('" + m + "') is not 'left right'");
    t.merge_rank_.emplace(m, static_cast<int32_t>(r));  // first occurrence wins
  }
  // A byte whose character is no token (Falcon's vocabulary lacks a few) is
  // the unknown token, or dropped without one, as llama.cpp does.
  return t;
}

// The pieces of one chunk: its merges by rank, the lowest first.
std::vector<std::string> Tokenizer::merge_bpe(const std::string& mapped, const StopCheck& stop) const {
  std::string key;
  auto rank = [&](std::string_view l, std::string_view r) -> std::optional<double> {
    key.assign(l).append(1, ' ').append(r);
    const auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return std::nullopt;
    return -static_cast<double>(it->second);  // the lowest rank first
  };
  std::vector<std::string> out;
  for (const Span& p : merge_symbols(mapped, rank, stop)) out.push_back(mapped.substr(p.start, p.len));
  return out;
}

std::vector<int32_t> Tokenizer::encode_bpe(const std::string& text, const StopCheck& stop) const {
  std::vector<int32_t> ids;
  uint32_t chunks = 0;
  for (const std::string& chunk : pre_->split(escape_spaces_ ? escape(text) : text)) {
    if ((++chunks & 255) == 0 && stop && stop()) cancelled();
    std::string mapped;
    if (byte_encode_)
      for (unsigned char c : chunk) mapped += bpe::byte_to_char(c);
    else
      mapped = chunk;
    // Whole chunks that are tokens skip the merges: always where the family
    // says so, and Gemma 4's runs of newlines.
    if (pre_->ignore_merges() || (!byte_encode_ && chunk.find_first_not_of('\n') == std::string::npos))
      if (auto it = index_.find(mapped); it != index_.end()) {
        ids.push_back(it->second);
        continue;
      }
    for (const std::string& s : merge_bpe(mapped, stop)) {
      auto it = index_.find(s);
      if (it != index_.end()) {
        ids.push_back(it->second);
        continue;
      }
      // Not a token (a merge whose result the vocabulary lacks): its
      // characters (byte-level), or its bytes' <0xNN> tokens (Gemma 4).
      if (!byte_encode_) {
        for (unsigned char c : s)
          if (byte_token_[c] >= 0 || unk_ >= 0) ids.push_back(byte_token_[c] >= 0 ? byte_token_[c] : unk_);
        continue;
      }
      for (size_t i = 0; i < s.size();) {
        const size_t l = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
        auto c = index_.find(s.substr(i, l));
        if (c != index_.end() || unk_ >= 0) ids.push_back(c != index_.end() ? c->second : unk_);
        i += l;
      }
    }
  }
  return ids;
}

Tokenizer Tokenizer::bytes(int64_t vocab) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {kUnknown, kControl, kControl};
  char buf[8];
  for (int b = 0; b < 256 && static_cast<int64_t>(pieces.size()) < vocab; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    pieces.emplace_back(buf);
    types.push_back(kByte);
  }
  while (static_cast<int64_t>(pieces.size()) < vocab) {
    pieces.push_back("<unused" + std::to_string(pieces.size()) + ">");
    types.push_back(kControl);
  }
  std::vector<float> scores(pieces.size(), 0.0f);
  return Tokenizer(std::move(pieces), std::move(scores), std::move(types), 1, 2, 0, false);
}

// Each special token in turn (longest first, as llama.cpp) splits the text
// fragments left: a pass over the text per token, so a vocabulary of
// thousands of them asks `stop` as it goes.
std::vector<Tokenizer::Fragment> Tokenizer::partition(const std::string& text, bool parse_special,
                                                      const StopCheck& stop) const {
  std::vector<Fragment> parts = {{-1, text}};
  uint32_t searched = 0;
  for (int32_t id : specials_) {
    if (!parse_special && types_[id] != kUserDefined) continue;
    if ((++searched & 63) == 0 && stop && stop()) cancelled();
    const std::string& needle = pieces_[id];
    const bool rstrip = rstrip_specials_ && types_[id] != kUnknown && id != bos_;
    std::vector<Fragment> next;
    for (Fragment& f : parts) {
      if (f.token >= 0) {
        next.push_back(std::move(f));
        continue;
      }
      size_t at = 0;
      for (size_t hit; (hit = f.text.find(needle, at)) != std::string::npos;) {
        if (hit > at) next.push_back({-1, f.text.substr(at, hit - at)});
        next.push_back({id, {}});
        at = hit + needle.size();
        if (rstrip)
          while (at < f.text.size() && std::isspace(static_cast<unsigned char>(f.text[at]))) ++at;
      }
      if (at < f.text.size()) next.push_back({-1, f.text.substr(at)});
    }
    parts = std::move(next);
  }
  return parts;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos, bool parse_special,
                                       const StopCheck& stop) const {
  std::vector<int32_t> ids;
  if (add_bos && add_bos_ && bos_ >= 0) ids.push_back(bos_);
  if (text.empty()) return ids;  // no space prefix either: the reference gives no tokens
  bool after_special = true;     // SentencePiece's space prefix: at the start and after each special token
  for (const Fragment& f : partition(text, parse_special, stop)) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::vector<int32_t> part =
        pre_ ? encode_bpe(f.text, stop) : encode_spm(space_prefix_ && after_special ? " " + f.text : f.text, stop);
    ids.insert(ids.end(), part.begin(), part.end());
    after_special = false;
  }
  return ids;
}

std::string Tokenizer::escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == ' ')
      out += kSpace;
    else
      out += c;
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode_spm(const std::string& text_in, const StopCheck& stop) const {
  const std::string text = escape_spaces_ ? escape(text_in) : text_in;
  std::string joined;
  auto score = [&](std::string_view l, std::string_view r) -> std::optional<double> {
    joined.assign(l).append(r);
    const auto it = index_.find(joined);
    if (it == index_.end()) return std::nullopt;
    return scores_[it->second];  // the highest-scoring piece first
  };
  const std::vector<Span> pieces = merge_symbols(text, score, stop);
  std::vector<int32_t> ids;
  for (const Span& p : pieces) {
    const std::string s = text.substr(p.start, p.len);
    auto it = index_.find(s);
    if (it != index_.end()) {
      ids.push_back(it->second);
      continue;
    }
    for (unsigned char c : s) ids.push_back(byte_token_[c] >= 0 ? byte_token_[c] : unk_);
  }
  return ids;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= size()) return "";
  if (types_[id] == kByte) {
    for (int b = 0; b < 256; ++b)
      if (byte_token_[b] == id) return std::string(1, static_cast<char>(b));
  }
  if (types_[id] == kControl || types_[id] == kUnknown) return "";
  const std::string& s = pieces_[id];
  if (pre_ && byte_encode_) {  // byte-level: each character back to its byte (user-defined text stays as is)
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const size_t l = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
      const int b = bpe::char_to_byte(s.substr(i, l));
      if (b >= 0)
        out += static_cast<char>(b);
      else
        out += s.substr(i, l);
      i += l;
    }
    return out;
  }
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kSpace) == 0) {
      out += ' ';
      i += 3;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += piece(id);
  if (space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);  // the added prefix
  return out;
}

}  // namespace anchorkv::model
