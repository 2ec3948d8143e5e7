#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>

#include "anchorkv/status.h"
#include "io/gguf.h"
#include "model/bpe.h"

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
  const std::vector<std::pair<std::string, float>> words = {{"\xE2\x96\x81", -1},
                                                            {"h", -2},
                                                            {"e", -2},
                                                            {"l", -2},
                                                            {"o", -2},
                                                            {"w", -2},
                                                            {"r", -2},
                                                            {"d", -2},
                                                            {"he", -3},
                                                            {"ll", -3},
                                                            {"hell", -4},
                                                            {"hello", -5},
                                                            {"\xE2\x96\x81hello", -6},
                                                            {"\xE2\x96\x81w", -3},
                                                            {"or", -3},
                                                            {"ld", -3},
                                                            {"\xE6\x97\xA5", -2}};  // 日
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
  for (const std::string& text : std::vector<std::string>{
           "hello", "caf\xC3\xA9 au lait", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "emoji \xF0\x9F\x99\x82!",
           std::string("tab\tnl\nnul", 10), "\xFF\xFE broken", "  two  spaces "}) {
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
  const auto p =
      std::filesystem::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "models" / "anchorkv-tiny.gguf";
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

TEST(Tokenizer, MalformedByteTokensAreIgnored) {
  // Type BYTE but not "<0xHH>": never a byte token (the fuzzer found "<0x-2>" indexing out of bounds).
  const std::vector<std::string> p = {"<unk>", "<0x-2>", "<0x4G>", "<0x41>", "<0x4a>"};
  const std::vector<int32_t> t = {Tokenizer::kUnknown, Tokenizer::kByte, Tokenizer::kByte, Tokenizer::kByte,
                                  Tokenizer::kByte};
  const Tokenizer tok(p, std::vector<float>(p.size(), 0.0f), t, -1, -1, 0, false);
  EXPECT_EQ(tok.encode("AJB", false), (std::vector<int32_t>{3, 4, 0}));  // 'B' has no byte token: <unk>
  EXPECT_EQ(tok.decode({3, 4}), "AJ");
}

// ---------------------------------------------------------------- byte-level BPE

using Chunks = std::vector<std::string>;

TEST(BpePreTokenizer, Gpt2PatternSplitsWordsNumbersPunctuationAndSpaces) {
  const bpe::PreTokenizer gpt2("gpt2");
  EXPECT_EQ(gpt2.split("Hello world's 123 ok!!\n\n  x"),
            (Chunks{"Hello", " world", "'s", " 123", " ok", "!!", "\n\n ", " x"}));
  // Letters beyond ASCII are \p{L}: Latin-1, Cyrillic, CJK.
  EXPECT_EQ(gpt2.split("h\xC3\xA9llo \xD0\xBC\xD0\xB8\xD1\x80 \xE6\x97\xA5\xE6\x9C\xAC"),
            (Chunks{"h\xC3\xA9llo", " \xD0\xBC\xD0\xB8\xD1\x80", " \xE6\x97\xA5\xE6\x9C\xAC"}));
  EXPECT_TRUE(gpt2.split("").empty());
}

TEST(BpePreTokenizer, Qwen2AndLlama3DifferInDigitRuns) {
  EXPECT_EQ(bpe::PreTokenizer("qwen2").split("abc 12345"), (Chunks{"abc", " ", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(bpe::PreTokenizer("llama-bpe").split("abc 12345"), (Chunks{"abc", " ", "123", "45"}));
  // Case-insensitive contractions, newline runs.
  EXPECT_EQ(bpe::PreTokenizer("qwen2").split("I'LL go\n\nnow"), (Chunks{"I", "'LL", " go", "\n\n", "now"}));
}

TEST(BpePreTokenizer, IllFormedUtf8BytesAreChunksOfTheirOwn) {
  const bpe::PreTokenizer gpt2("gpt2");
  EXPECT_EQ(gpt2.split("ab\xFF"
                       "cd\xE2\x82"),
            (Chunks{"ab", "\xFF", "cd", "\xE2", "\x82"}));
}

TEST(BpePreTokenizer, UnknownNameIsUnsupported) {
  try {
    bpe::PreTokenizer p("klingon");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("klingon"), std::string::npos);
  }
}

TEST(BpeByteMap, IsABijectionWithGpt2sPrintableCharacters) {
  EXPECT_EQ(bpe::byte_to_char('a'), "a");
  EXPECT_EQ(bpe::byte_to_char(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(bpe::byte_to_char('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(bpe::byte_to_char(0), "\xC4\x80");     // U+0100
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(bpe::char_to_byte(bpe::byte_to_char(static_cast<unsigned char>(b))), b);
  EXPECT_EQ(bpe::char_to_byte("\xE6\x97\xA5"), -1);
}

Tokenizer toy_bpe(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  std::vector<std::string> p;
  std::vector<int32_t> t;
  for (int b = 0; b < 256; ++b) {
    p.push_back(bpe::byte_to_char(static_cast<unsigned char>(b)));
    t.push_back(Tokenizer::kNormal);
  }
  for (const auto& w : extra) {
    p.push_back(w);
    t.push_back(Tokenizer::kNormal);
  }
  p.push_back("<|endoftext|>");
  t.push_back(Tokenizer::kControl);
  const int32_t eot = static_cast<int32_t>(p.size()) - 1;
  return Tokenizer::byte_level_bpe(p, t, merges, "gpt2", eot, eot, -1);
}

int32_t id_of(const Tokenizer& tok, const std::string& piece) {
  for (int32_t i = 0; i < tok.size(); ++i)
    if (tok.piece(i) == piece) return i;
  return -1;
}

TEST(BpeTokenizer, MergesApplyInRankOrder) {
  // "Ġ" is the byte-level space.
  const Tokenizer tok = toy_bpe({"he", "ll", "hell", "\xC4\xA0w", "or", "\xC4\xA0wor"},
                                {"h e", "l l", "he ll", "\xC4\xA0 w", "o r", "\xC4\xA0w or"});
  ASSERT_TRUE(tok.is_bpe());
  const auto ids = tok.encode("hello world", false);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(tok.piece(id));
  EXPECT_EQ(pieces, (Chunks{"hell", "o", " wor", "l", "d"}));
  // Ranks decide, not order of appearance: "o r" (rank 4) loses to "Ġ w" (rank 3).
  EXPECT_EQ(ids[2], id_of(tok, " wor"));
  // gpt2 models add no BOS unless the file says so.
  EXPECT_EQ(tok.encode("hello", true).size(), tok.encode("hello", false).size());
}

TEST(BpeTokenizer, AMergeOutsideTheVocabularyFallsBackToCharacters) {
  const Tokenizer tok = toy_bpe({"ab"}, {"a b", "ab c"});  // "abc" is no token
  const auto ids = tok.encode("abc", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tok.piece(ids[0]), "a");
  EXPECT_EQ(tok.piece(ids[1]), "b");
  EXPECT_EQ(tok.piece(ids[2]), "c");
  EXPECT_EQ(tok.decode(ids), "abc");
}

TEST(BpeTokenizer, RoundTripsAsciiUtf8AndArbitraryBytes) {
  const Tokenizer tok = toy_bpe({"he", "ll", "hell"}, {"h e", "l l", "he ll"});
  const std::vector<std::string> texts = {
      "hello, world!  tabs\tand\nnewlines\n",
      "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80",
      std::string("nul\0byte", 8), "\xFF\xFE\x80 broken \xE2\x82 utf8", ""};
  for (const auto& s : texts) EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << s;
}

// The rescanning algorithm the heap replaced: merge the lowest-ranked
// adjacent pair, leftmost on ties, until none is a merge.
std::vector<std::string> rescanning_merges(const std::string& word, const std::vector<std::string>& merges) {
  std::map<std::string, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank.emplace(merges[r], r);
  std::vector<std::string> sym;
  for (char c : word) sym.push_back(bpe::byte_to_char(static_cast<unsigned char>(c)));
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (auto it = rank.find(sym[i] + " " + sym[i + 1]); it != rank.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    if (best == SIZE_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return sym;
}

TEST(BpeTokenizer, TheMergeHeapGivesTheRescanningAlgorithmsPieces) {
  // Random merges over a three-letter alphabet (many ties and overlaps), every result a token.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> merges, pieces = {"a", "b", "c"};
    for (int m = 0; m < 30; ++m) {
      const std::string l = pieces[rng() % pieces.size()], r = pieces[rng() % pieces.size()];
      merges.push_back(l + " " + r);
      pieces.push_back(l + r);
    }
    const Tokenizer tok = toy_bpe(std::vector<std::string>(pieces.begin() + 3, pieces.end()), merges);
    for (int w = 0; w < 20; ++w) {
      std::string word(1 + rng() % 40, 'a');
      for (char& ch : word) ch = static_cast<char>('a' + rng() % 3);
      std::vector<std::string> got;
      for (int32_t id : tok.encode(word, false)) got.push_back(tok.piece(id));
      ASSERT_EQ(got, rescanning_merges(word, merges)) << word;
    }
  }
}

// Merges "a a", "aa aa", ... up to 2^levels letters: one long word keeps merging all the way up.
Tokenizer doubling_bpe(int levels) {
  std::vector<std::string> pieces, merges;
  for (std::string p = "a"; static_cast<int>(pieces.size()) < levels; p += p) {
    merges.push_back(p + " " + p);
    pieces.push_back(p + p);
  }
  return toy_bpe(pieces, merges);
}

TEST(BpeTokenizer, ALongWordCostsNLogNAndStopsWhenAsked) {
  const Tokenizer tok = doubling_bpe(16);
  const std::string word(65536, 'a');
  const auto ids = tok.encode(word, false);  // the rescanning algorithm took minutes (test timeout)
  ASSERT_EQ(ids.size(), 1u);                  // 2^16 letters merge into one token
  EXPECT_EQ(tok.piece(ids[0]), word);
  int asked = 0;
  try {
    tok.encode(word, false, false, [&] { return ++asked >= 3; });
    ADD_FAILURE() << "a stop that answers true must end the work";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled);
  }
  EXPECT_EQ(asked, 3);
}

TEST(Tokenizer, SplittingAtManySpecialTokensStopsWhenAsked) {
  std::vector<std::string> p = {"<unk>", "<s>", "</s>", "x"};
  std::vector<int32_t> t = {Tokenizer::kUnknown, Tokenizer::kControl, Tokenizer::kControl, Tokenizer::kNormal};
  for (int i = 0; i < 200; ++i) {
    p.push_back("<tag" + std::to_string(i) + ">");
    t.push_back(Tokenizer::kUserDefined);
  }
  const Tokenizer tok(p, std::vector<float>(p.size(), 0.0f), t, 1, 2, 0, false);
  EXPECT_EQ(tok.encode("x<tag7>x", false), (std::vector<int32_t>{3, 4 + 7, 3}));
  try {
    tok.encode("x<tag7>x", false, false, [] { return true; });
    ADD_FAILURE() << "a stop that answers true must end the search of 200 special tokens";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled);
  }
}

TEST(Tokenizer, SentencePieceMergesStopWhenAsked) {
  const Tokenizer tok = toy();
  try {
    tok.encode(std::string(40000, 'l'), false, false, [] { return true; });
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled);
  }
}

TEST(BpeTokenizer, MalformedMergesAreCorruptFiles) {
  for (const std::string bad : {"nospace", " leading", "trailing ", "a b c"}) {
    try {
      toy_bpe({}, {bad});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruptFile);
      EXPECT_NE(std::string(e.what()).find("merge 0"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace anchorkv::model
