// The text a request streams: held back while it could begin a stop string
// or ends inside a UTF-8 character, cut at the earliest stop string. Checked
// against the straightforward rescan of the held text on random streams.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/engine.h"

namespace anchorkv::serve {
namespace {

// The rescan TextStream's automata replaced: the earliest stop string in the
// held text, else hold its longest tail that begins one (ASCII here).
struct RescanStream {
  std::vector<std::string> stop;
  std::string pending;
  std::string push(const std::string& piece, bool* stopped) {
    pending += piece;
    size_t first = std::string::npos;
    for (const auto& s : stop) first = std::min(first, pending.find(s));
    if (first != std::string::npos) {
      *stopped = true;
      return pending.substr(0, first);
    }
    size_t hold = 0;
    for (const auto& s : stop)
      for (size_t n = std::min(s.size() - 1, pending.size()); n > hold; --n)
        if (pending.compare(pending.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
    std::string out = pending.substr(0, pending.size() - hold);
    pending.erase(0, pending.size() - hold);
    return out;
  }
};

TEST(TextStream, StopStringsSplitAcrossPiecesAreHeldThenCut) {
  TextStream t({"<|im_end|>", "\n\nUser:"});
  bool stopped = false;
  EXPECT_EQ(t.push("Hello <|im", &stopped), "Hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(t.push("_e", &stopped), "");
  EXPECT_EQ(t.push("nd|> after", &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(TextStream, TheEarliestStopStringWinsAndHeldTextComesOutAtTheEnd) {
  TextStream t({"abcd", "bc"});
  bool stopped = false;
  EXPECT_EQ(t.push("xabcd", &stopped), "x");  // "abcd" starts before "bc"
  EXPECT_TRUE(stopped);
  TextStream u({"stop"});
  stopped = false;
  EXPECT_EQ(u.push("so st", &stopped), "so ");
  EXPECT_EQ(u.finish(), "st");
}

TEST(TextStream, IncompleteUtf8IsHeldUntilItsCharacterEnds) {
  TextStream t({});
  bool stopped = false;
  EXPECT_EQ(t.push("caf\xC3", &stopped), "caf");
  EXPECT_EQ(t.push("\xA9!", &stopped), "\xC3\xA9!");
}

TEST(TextStream, AgreesWithTheRescanOnRandomStreams) {
  std::mt19937 rng(3);
  auto word = [&](size_t n) {
    std::string s(n, 'a');
    for (char& c : s) c = static_cast<char>('a' + rng() % 3);
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    for (int i = 0; i < 1 + static_cast<int>(rng() % 3); ++i) stops.push_back(word(1 + rng() % 6));
    TextStream fast(stops);
    RescanStream slow{stops, ""};
    std::string a, b;
    bool sa = false, sb = false;
    for (int piece = 0; piece < 12 && !sa; ++piece) {
      const std::string p = word(rng() % 4);
      a += fast.push(p, &sa);
      b += slow.push(p, &sb);
      ASSERT_EQ(sa, sb);
      ASSERT_EQ(a, b) << "trial " << trial;
    }
  }
}

TEST(TextStream, ALongStopStringCostsEachPieceItsOwnLength) {
  // A stop string of 256 KiB of 'a' then 'b', and a stream of 'a's: the
  // rescan compared the whole held text per piece (minutes for this stream).
  const std::string stop = std::string(1 << 18, 'a') + "b";
  TextStream t({stop});
  bool stopped = false;
  std::string out;
  for (int i = 0; i < 50000; ++i) out += t.push("aaaaaaa", &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(out.size(), 350000u - (1u << 18));  // the last 2^18 letters could still begin it
  EXPECT_EQ(t.push("b", &stopped), "");  // the held letters were the stop string's start
  EXPECT_TRUE(stopped);
}

}  // namespace
}  // namespace anchorkv::serve
