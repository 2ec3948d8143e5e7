// libFuzzer target for the server's request heads and chunk sizes: every
// input is read or refused, and what is read is well formed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "serve/http_head.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const anchorkv::serve::HttpHead h = anchorkv::serve::parse_http_head(text);
  if (h.status == 0) {
    if (h.method.empty() || h.path.empty() || h.path[0] != '/') std::abort();
    if (h.content_length && h.chunked) std::abort();  // an ambiguous body length was accepted
    for (const auto& field : h.headers)
      if (field.second.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos) std::abort();
  } else if (h.why.empty()) {
    std::abort();
  }
  if (const auto n = anchorkv::serve::parse_chunk_size(text); n && *n > 0xfffffffffffffffull) std::abort();
  return 0;
}
