#include "model/bpe.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/error.h"

namespace anchorkv::model::bpe {

namespace {
constexpr const char* kOp = "anchorkv::Tokenizer";

struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, int> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const UChar32 cp = printable ? b : 256 + extra++;
      char buf[4];
      int32_t len = 0;
      UBool err = false;
      U8_APPEND(reinterpret_cast<uint8_t*>(buf), len, 4, cp, err);
      (void)err;  // cp < 512 always fits in 4 bytes
      to_char[b].assign(buf, static_cast<size_t>(len));
      to_byte.emplace(to_char[b], b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The reference tokenizers' split patterns, as in their tokenizer.json (the
// Hugging Face tokenizers run them with Rust's regex crate, whose \s is
// Unicode White_Space: see unicode_spaces below).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt2NoTail = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's letters: the cased scripts, listed as its tokenizer.json lists them.
constexpr const char* kDeepseekLetters =
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+";
constexpr const char* kCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";

// A family: its split patterns in order, and whether chunks that are tokens skip the merges.
struct Family {
  std::vector<std::string> names;
  std::vector<std::string> patterns;
  bool ignore_merges = false;
};
const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {{"", "default", "gpt2", "gpt-2", "mpt", "olmo", "phi-2", "jais", "exaone4", "trillion"}, {kGpt2}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4"},
       {kLlama3},
       true},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLetters, "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", kCjk,
        "\\p{N}+"}},
      {{"deepseek-coder"}, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"}},
      {{"deepseek-v3"},
       {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2NoTail, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {"\\p{N}", kGpt2NoTail}},
      {{"gemma4"}, {"[^\n]+|[\n]+"}},
  };
  return kFamilies;
}

std::string family_list() {
  std::string out;
  for (const Family& f : families())
    for (const std::string& n : f.names)
      if (!n.empty()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// \s and \S as the reference's regex engine means them (Unicode White_Space;
// ICU's \s omits \v, U+0085 and the like).
std::string unicode_spaces(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char c = pattern[i + 1];
      out += c == 's' ? "\\p{White_Space}" : c == 'S' ? "\\P{White_Space}" : pattern.substr(i, 2);
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}
}  // namespace

const std::string& byte_to_char(unsigned char b) { return byte_map().to_char[b]; }

int char_to_byte(const std::string& c) {
  const auto& m = byte_map().to_byte;
  auto it = m.find(c);
  return it == m.end() ? -1 : it->second;
}

struct PreTokenizer::Impl {
  std::vector<std::unique_ptr<icu::RegexPattern>> patterns;
};

PreTokenizer::PreTokenizer(const std::string& name) : impl_(std::make_unique<Impl>()) {
  const Family* family = nullptr;
  for (const Family& f : families())
    if (std::find(f.names.begin(), f.names.end(), name) != f.names.end()) family = &f;
  if (!family)
    core::fail(ErrorCode::kUnsupported, kOp,
               "pre-tokenizer '" + name + "' is not supported (" + family_list() + " are)");
  ignore_merges_ = family->ignore_merges;
  for (const std::string& p : family->patterns) {
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    impl_->patterns.emplace_back(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(unicode_spaces(p)), pe, st));
    if (U_FAILURE(st)) core::fail(ErrorCode::kUnsupported, kOp, std::string("ICU regex: ") + u_errorName(st));
  }
}

PreTokenizer::~PreTokenizer() = default;

namespace {
// Splits every chunk into the pattern's matches and the gaps between them.
std::vector<icu::UnicodeString> split_by(const icu::RegexPattern& pattern, const std::vector<icu::UnicodeString>& in) {
  std::vector<icu::UnicodeString> out;
  for (const icu::UnicodeString& u : in) {
    UErrorCode st = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> m(pattern.matcher(u, st));
    if (U_FAILURE(st)) core::fail(ErrorCode::kUnsupported, kOp, std::string("ICU matcher: ") + u_errorName(st));
    int32_t done = 0;
    auto emit = [&](int32_t a, int32_t b) {
      if (b > a) out.emplace_back(u, a, b - a);
    };
    while (m->find(st) && U_SUCCESS(st)) {
      const int32_t a = m->start(st), b = m->end(st);
      emit(done, a);
      emit(a, b);
      done = b;
    }
    emit(done, u.length());
  }
  return out;
}
}  // namespace

std::vector<std::string> PreTokenizer::split(const std::string& text) const {
  std::vector<std::string> out;
  auto run_patterns = [&](const std::string& valid) {
    std::vector<icu::UnicodeString> chunks = {icu::UnicodeString::fromUTF8(valid)};
    for (const auto& p : impl_->patterns) chunks = split_by(*p, chunks);
    for (const icu::UnicodeString& c : chunks) {
      std::string s;
      c.toUTF8String(s);
      out.push_back(std::move(s));
    }
  };
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  int32_t run = 0, i = 0;
  while (i < n) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0) {  // ill-formed: flush the valid run, then each byte alone
      if (start > run) run_patterns(text.substr(static_cast<size_t>(run), static_cast<size_t>(start - run)));
      for (int32_t j = start; j < i; ++j) out.emplace_back(1, text[static_cast<size_t>(j)]);
      run = i;
    }
  }
  if (n > run) run_patterns(text.substr(static_cast<size_t>(run)));
  return out;
}

}  // namespace anchorkv::model::bpe
