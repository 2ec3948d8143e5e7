// HTTP/1.1 request heads (RFC 9112), parsed strictly: a head that is not
// exactly one request line and well-formed header fields, or that frames its
// body ambiguously (Content-Length with Transfer-Encoding, a repeated or
// signed length, a coding other than chunked, no or several Host fields), is
// refused with the status to answer. Pure functions over bytes already read,
// so they are tested and fuzzed without a socket (fuzz/http_head_fuzz.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace anchorkv::serve {

// A request's head; `status` is nonzero when it must be refused (`why` says why).
struct HttpHead {
  int status = 0;
  std::string why;
  std::string method, path;  // path without its query
  bool http11 = true, keep_alive = true, chunked = false, expect_continue = false;
  std::optional<uint64_t> content_length;
  std::map<std::string, std::string> headers;  // lower-case names; repeated fields joined by ", "
};

HttpHead refused_head(int status, std::string why);

// The head's text: CRLF-separated lines, without the final empty line.
HttpHead parse_http_head(std::string_view text);

// A chunk's size line (hex digits, then optional whitespace and ";"
// extensions, which are dropped): the size, or nothing when malformed or
// past 15 hex digits.
std::optional<uint64_t> parse_chunk_size(std::string_view line);

// Lower-case copy; whether a comma-separated field value holds `token` (case-insensitive).
std::string lower(std::string_view s);
bool has_token(std::string_view value, std::string_view token);

}  // namespace anchorkv::serve
