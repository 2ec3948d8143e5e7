#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "io/gguf.h"

namespace anchorkv::model {
namespace {

Tokenizer toy() {
  std::vector<std::string> p = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> t = {Tokenizer::kUnknown, Tokenizer::kControl, Tokenizer::kControl};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    p.emplace_back(buf);
    t.push_back(Tokenizer::kByte);
  }
  const std::vector<std::pair<std::string, float>> words = {
      {"\xE2\x96\x81", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
      {"he", -3}, {"ll", -3}, {"hell", -4}, {"hello", -5}, {"\xE2\x96\x81hello", -6}, {"\xE2\x96\x81w", -3},
      {"or", -3}, {"ld", -3}, {"\xE6\x97\xA5", -2}};  // 日
  std::vector<float> s(p.size(), 0.0f);
  for (const auto& [w, sc] : words) {
    p.push_back(w);
    t.push_back(Tokenizer::kNormal);
    s.push_back(sc);
  }
  return Tokenizer(p, s, t, 1, 2, 0, /*escape_spaces=*/true);
}

TEST(Tokenizer, MergesByScoreWithSpaceEscaping) {
  const Tokenizer tok = toy();
  const auto ids = tok.encode("hello world", true);
  std::vector<std::string> pieces;
  for (size_t i = 1; i < ids.size(); ++i) pieces.push_back(tok.piece(ids[i]));
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(pieces, (std::vector<std::string>{" hello", " w", "or", "ld"}));
  EXPECT_EQ(tok.decode(ids), "hello world");
}

TEST(Tokenizer, ByteFallbackAndUtf8RoundTrips) {
  const Tokenizer tok = toy();
  for (const std::string& text : std::vector<std::string>{"hello", "caf\xC3\xA9 au lait", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                                 "emoji \xF0\x9F\x99\x82!", std::string("tab\tnl\nnul", 10), "\xFF\xFE broken",
                                 "  two  spaces "}) {
    const auto ids = tok.encode(text, false);
    EXPECT_EQ(tok.decode(ids), text) << text;
  }
  // é is no piece: its two UTF-8 bytes become byte tokens; 日 is a piece.
  const auto ids = tok.encode("\xC3\xA9\xE6\x97\xA5", false);
  ASSERT_EQ(ids.size(), 4u);  // ▁, <0xC3>, <0xA9>, 日
  EXPECT_EQ(ids[1], 3 + 0xC3);
  EXPECT_EQ(ids[2], 3 + 0xA9);
  EXPECT_EQ(tok.piece(ids[3]), "\xE6\x97\xA5");
}

TEST(Tokenizer, SharedTinyModelIsByteLevel) {
  const auto p = std::filesystem::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "models" / "anchorkv-tiny.gguf";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << "shared model not present";
  const Tokenizer tok = Tokenizer::from_gguf(io::GgufFile::open(p.string()));
  EXPECT_EQ(tok.size(), 259);
  const std::string text = "Hi \xC3\xA9!";
  const auto ids = tok.encode(text, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3 + 'H', 3 + 'i', 3 + ' ', 3 + 0xC3, 3 + 0xA9, 3 + '!'}));
  EXPECT_EQ(tok.decode(ids), text);
  const Tokenizer b = Tokenizer::bytes(512);
  EXPECT_EQ(b.encode("ab", true), (std::vector<int32_t>{1, 3 + 'a', 3 + 'b'}));
}

}  // namespace
}  // namespace anchorkv::model
