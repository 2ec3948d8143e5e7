// The server's request heads and chunk sizes, parsed strictly (the
// framing every request smuggling attack plays on), and never past their
// bytes whatever they hold (this suite also runs under AddressSanitizer).
#include "serve/http_head.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace anchorkv::serve {
namespace {

HttpHead head(const std::string& text) { return parse_http_head(text); }

TEST(HttpHead, AWellFormedHeadIsRead) {
  const HttpHead h = head("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                          "X-Tag: one\r\nx-tag:  two \r\nConnection: keep-alive");
  EXPECT_EQ(h.status, 0) << h.why;
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.path, "/v1/chat/completions") << "the query is not the path";
  EXPECT_EQ(h.content_length, 12u);
  EXPECT_TRUE(h.keep_alive && h.http11 && !h.chunked);
  EXPECT_EQ(h.headers.at("x-tag"), "one, two") << "names lower-cased, repeats joined, values trimmed";
  const HttpHead old = head("GET / HTTP/1.0");
  EXPECT_EQ(old.status, 0) << "HTTP/1.0 needs no Host";
  EXPECT_FALSE(old.keep_alive) << "HTTP/1.0 closes unless asked";
  EXPECT_TRUE(head("GET / HTTP/1.0\r\nConnection: Keep-Alive").keep_alive);
  EXPECT_FALSE(head("GET / HTTP/1.1\r\nHost: a\r\nConnection: x, close").keep_alive);
  const HttpHead chunked = head("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\nExpect: 100-continue");
  EXPECT_EQ(chunked.status, 0);
  EXPECT_TRUE(chunked.chunked && chunked.expect_continue);
}

TEST(HttpHead, AmbiguousFramingIsRefused) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456789", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked", 501},
      {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\n X-Folded: yes", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x", 400},
      {"GET / HTTP/1.1\r\nHost : a", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b", 400},
      {"GET / HTTP/1.1\r\nAccept: */*", 400},
      {"GET / HTTP/1.1\nHost: a", 400},
      {"GET / HTTP/1.1\r\nHost: a\rb", 400},
      {std::string("GET / HTTP/1.1\r\nHost: a\0b", 25), 400},
      {std::string("GET / HTTP/1.1\r\n\0Host: a", 25), 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01", 400},
      {"GET  / HTTP/1.1\r\nHost: a", 400},
      {"GET http://a/ HTTP/1.1\r\nHost: a", 400},
      {"GET / HTTP/2.0\r\nHost: a", 505},
      {"GET / HTTP/1.1 extra\r\nHost: a", 400},
      {"GET / HTX/1.1\r\nHost: a", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nExpect: something", 417},
      {"", 400},
      {"\r\n", 400},
  };
  for (const auto& [text, status] : cases) {
    const HttpHead h = head(text);
    EXPECT_EQ(h.status, status) << "head: " << testing::PrintToString(text) << " (" << h.why << ")";
    EXPECT_FALSE(h.why.empty()) << testing::PrintToString(text);
  }
}

TEST(HttpHead, ChunkSizesAreHexWithinFifteenDigits) {
  EXPECT_EQ(parse_chunk_size("1f"), 31u);
  EXPECT_EQ(parse_chunk_size("A;name=value"), 10u) << "extensions are dropped";
  EXPECT_EQ(parse_chunk_size("10 \t;ext"), 16u);
  EXPECT_EQ(parse_chunk_size("0"), 0u);
  EXPECT_EQ(parse_chunk_size("fffffffffffffff"), 0xfffffffffffffffull);
  for (const char* bad : {"", ";ext", "0x10", "-1", "+1", " 1", "1 2", "g", "ffffffffffffffff", "1\r"})
    EXPECT_FALSE(parse_chunk_size(bad).has_value()) << testing::PrintToString(bad);
}

// Random edits of well-formed heads: every result is either accepted with a
// method token and an origin-form path, or refused with a status and why.
TEST(HttpHead, MutatedHeadsAreReadOrRefusedNeverMisread) {
  const std::vector<std::string> seeds = {
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nConnection: close",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue",
      "GET /health HTTP/1.0\r\nConnection: keep-alive\r\nX-A: 1, 2"};
  static constexpr char kEdits[] = "\r\n\t :;,/-+0123456789aAzZ\x01\x7f\x80\xff";
  const std::string alphabet(kEdits, sizeof kEdits);  // with its NUL
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::string t = seeds[rng() % seeds.size()];
    for (int e = 1 + static_cast<int>(rng() % 4); e > 0 && !t.empty(); --e) {
      const size_t at = rng() % t.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: t[at] = c; break;
        case 1: t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: t.erase(at, 1 + rng() % 8); break;
      }
    }
    const HttpHead h = head(t);
    if (h.status != 0) {
      EXPECT_TRUE(h.status == 400 || h.status == 417 || h.status == 501 || h.status == 505) << h.status;
      EXPECT_FALSE(h.why.empty());
      continue;
    }
    ASSERT_FALSE(h.method.empty()) << testing::PrintToString(t);
    ASSERT_EQ(h.path[0], '/') << testing::PrintToString(t);
    ASSERT_FALSE(h.content_length && h.chunked) << testing::PrintToString(t);
    for (const auto& [name, value] : h.headers) {
      ASSERT_EQ(name, lower(name));
      ASSERT_EQ(value.find_first_of(std::string("\r\n\0", 3)), std::string::npos) << testing::PrintToString(t);
    }
  }
}

}  // namespace
}  // namespace anchorkv::serve
