#include "model/bpe.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

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

// The reference tokenizers' split patterns (as in their tokenizer.json).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}  // namespace

const std::string& byte_to_char(unsigned char b) { return byte_map().to_char[b]; }

int char_to_byte(const std::string& c) {
  const auto& m = byte_map().to_byte;
  auto it = m.find(c);
  return it == m.end() ? -1 : it->second;
}

struct PreTokenizer::Impl {
  std::unique_ptr<icu::RegexPattern> pattern;
};

PreTokenizer::PreTokenizer(const std::string& name) : impl_(std::make_unique<Impl>()) {
  if (name.empty() || name == "default" || name == "gpt2" || name == "gpt-2")
    pattern_ = kGpt2;
  else if (name == "llama-bpe" || name == "llama3")
    pattern_ = kLlama3;
  else if (name == "qwen2")
    pattern_ = kQwen2;
  else
    core::fail(ErrorCode::kUnsupported, kOp,
               "pre-tokenizer '" + name + "' is not supported (default/gpt2, llama-bpe, qwen2 are)");
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe;
  impl_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern_), pe, st));
  if (U_FAILURE(st)) core::fail(ErrorCode::kUnsupported, kOp, std::string("ICU regex: ") + u_errorName(st));
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::split(const std::string& text) const {
  std::vector<std::string> out;
  auto run_pattern = [&](const std::string& valid) {
    UErrorCode st = U_ZERO_ERROR;
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(valid);
    std::unique_ptr<icu::RegexMatcher> m(impl_->pattern->matcher(u, st));
    if (U_FAILURE(st))
      core::fail(ErrorCode::kUnsupported, kOp, std::string("ICU matcher: ") + u_errorName(st));
    int32_t done = 0;
    auto emit = [&](int32_t a, int32_t b) {
      if (b <= a) return;
      std::string s;
      u.tempSubStringBetween(a, b).toUTF8String(s);
      out.push_back(std::move(s));
    };
    while (m->find(st) && U_SUCCESS(st)) {
      const int32_t a = m->start(st), b = m->end(st);
      emit(done, a);  // a gap (the patterns match everything; kept for safety)
      emit(a, b);
      done = b;
    }
    emit(done, u.length());
  };
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  int32_t run = 0, i = 0;
  while (i < n) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0) {  // ill-formed: flush the valid run, then each byte alone
      if (start > run) run_pattern(text.substr(static_cast<size_t>(run), static_cast<size_t>(start - run)));
      for (int32_t j = start; j < i; ++j) out.emplace_back(1, text[static_cast<size_t>(j)]);
      run = i;
    }
  }
  if (n > run) run_pattern(text.substr(static_cast<size_t>(run)));
  return out;
}

}  // namespace anchorkv::model::bpe
