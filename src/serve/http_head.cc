#include "serve/http_head.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

namespace anchorkv::serve {
namespace {

bool is_tchar(unsigned char c) {
  return std::isalnum(c) || (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);  // strchr finds the NUL
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The request line: method SP origin-form target SP HTTP-version.
bool parse_request_line(std::string_view line, HttpHead& h) {
  const size_t a = line.find(' '), b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos) return false;
  const std::string_view method = line.substr(0, a), target = line.substr(a + 1, b - a - 1),
                         version = line.substr(b + 1);
  if (!is_token(method) || target.empty() || target[0] != '/') return false;
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7F) return false;
  if (version == "HTTP/1.1") {
    h.http11 = true;
  } else if (version == "HTTP/1.0") {
    h.http11 = false;
  } else {
    h.status = version.size() == 8 && version.substr(0, 5) == "HTTP/" ? 505 : 400;
    h.why = "unsupported HTTP version";
    return true;
  }
  h.method = std::string(method);
  h.path = std::string(target.substr(0, target.find('?')));
  return true;
}

// One header line into `h`; false when it is malformed.
bool parse_header_line(std::string_view line, HttpHead& h, int& hosts, bool& had_te) {
  if (line[0] == ' ' || line[0] == '\t') return false;  // obs-fold
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) return false;  // incl. "Name :"
  const std::string name = lower(line.substr(0, colon));
  const std::string_view value = trim_ows(line.substr(colon + 1));
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7F) return false;
  }
  if (name == "content-length") {
    if (h.content_length || value.empty() || value.size() > 18 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;  // repeated, negative, signed, listed, not a number, or past any body size
    h.content_length = std::stoull(std::string(value));
  } else if (name == "transfer-encoding") {
    if (had_te) return false;
    had_te = true;
    h.chunked = lower(value) == "chunked";
    if (!h.chunked) {
      h.status = 501;
      h.why = "the only transfer coding accepted is chunked";
    }
  } else if (name == "host") {
    ++hosts;
  } else if (name == "expect") {
    if (lower(value) != "100-continue") {
      h.status = 417;
      h.why = "the only expectation met is 100-continue";
    }
    h.expect_continue = true;
  }
  if (name == "connection") {
    if (has_token(value, "close")) h.keep_alive = false;
    if (!h.http11 && has_token(value, "keep-alive")) h.keep_alive = true;
  }
  std::string& slot = h.headers[name];
  slot = slot.empty() ? std::string(value) : slot + ", " + std::string(value);
  return true;
}

// The head (CRLF line endings, without the final empty line).
}  // namespace

HttpHead parse_http_head(std::string_view text) {
  HttpHead h;
  h.keep_alive = true;
  int hosts = 0;
  bool had_te = false, first = true;
  while (!text.empty()) {
    const size_t end = text.find("\r\n");
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 2);
    if (line.find_first_of("\r\n") != std::string_view::npos || line.find('\0') != std::string_view::npos)
      return refused_head(400, "a bare CR or LF, or a NUL, in the request head");
    if (first) {
      if (!parse_request_line(line, h)) return refused_head(400, "malformed request line");
      if (h.status) return h;
      h.keep_alive = h.http11;
      first = false;
      continue;
    }
    if (line.empty() || !parse_header_line(line, h, hosts, had_te)) return refused_head(400, "malformed header line");
  }
  if (first) return refused_head(400, "no request line");
  if (h.status) return h;
  if (h.content_length && had_te)
    return refused_head(400, "Content-Length and Transfer-Encoding together: the body's length is ambiguous");
  if (had_te && !h.http11) return refused_head(400, "Transfer-Encoding in an HTTP/1.0 request");
  if (h.http11 && hosts != 1) return refused_head(400, hosts == 0 ? "no Host header" : "more than one Host header");
  return h;
}


HttpHead refused_head(int status, std::string why) {
  HttpHead h;
  h.status = status;
  h.why = std::move(why);
  return h;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    if (lower(trim_ows(value.substr(0, comma))) == token) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

std::optional<uint64_t> parse_chunk_size(std::string_view line) {
  std::string_view digits = line.substr(0, line.find(';'));
  while (!digits.empty() && (digits.back() == ' ' || digits.back() == '\t')) digits.remove_suffix(1);
  if (digits.empty() || digits.size() > 15) return std::nullopt;
  uint64_t size = 0;
  for (char c : digits) {
    const int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                              : -1;
    if (v < 0) return std::nullopt;
    size = size * 16 + static_cast<uint64_t>(v);
  }
  return size;
}

}  // namespace anchorkv::serve
