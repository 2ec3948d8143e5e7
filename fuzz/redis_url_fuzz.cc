// libFuzzer target for `serve --kv-store` URLs: every input parses or is
// refused with an Error, and what parses prints without its password.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "anchorkv/status.h"
#include "serve/redis_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  try {
    const anchorkv::serve::RedisAddress a = anchorkv::serve::parse_redis_url(url);
    anchorkv::serve::RedisAddress other = a;
    other.password = a.password + "x";
    if (!a.password.empty() && other.redacted() != a.redacted()) std::abort();  // the password shows
    if (!a.unix_socket && (a.port < 1 || a.port > 65535)) std::abort();
  } catch (const anchorkv::Error&) {
  }
  return 0;
}
