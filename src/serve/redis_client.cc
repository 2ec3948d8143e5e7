#include "serve/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>

#include "anchorkv/status.h"
#include "core/error.h"

namespace anchorkv::serve {
namespace {

[[noreturn]] void bad_url(const std::string& option, const std::string& why) {
  core::fail(
      ErrorCode::kInvalidArgument, "anchorkv serve " + option,
      why + " (expected redis://[user:password@]host[:port][/db] or unix://[user:password@]/path[?db=N])");
}

int parse_int(std::string_view s, int lo, int hi, const std::string& option, const char* what) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
    bad_url(option, std::string("the ") + what + " must be a number in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return v;
}

std::string percent_decode(std::string_view s, const std::string& option) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    unsigned v = 0;
    if (i + 2 >= s.size() ||
        std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr != s.data() + i + 3)
      bad_url(option, "a '%' in the credentials is not followed by two hex digits");
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

// "user:password", ":password" or "user" before the '@'.
void parse_credentials(std::string_view info, RedisAddress& a, const std::string& option) {
  const size_t colon = info.find(':');
  a.user = percent_decode(info.substr(0, colon), option);
  if (colon != std::string_view::npos) a.password = percent_decode(info.substr(colon + 1), option);
}

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.items.push_back(convert(r->element[i]));
      break;
    default:
      break;  // nil
  }
  return out;
}

}  // namespace

RedisAddress parse_redis_url(const std::string& url, const std::string& option) {
  RedisAddress a;
  std::string_view rest(url);
  auto take_scheme = [&](std::string_view scheme) {
    if (rest.substr(0, scheme.size()) != scheme) return false;
    rest.remove_prefix(scheme.size());
    return true;
  };
  if (take_scheme("unix://")) {
    a.unix_socket = true;
    if (const size_t at = rest.find('@'); at != std::string_view::npos && rest.substr(0, 1) != "/") {
      parse_credentials(rest.substr(0, at), a, option);
      rest.remove_prefix(at + 1);
    }
    const size_t query = rest.find('?');
    a.path = std::string(rest.substr(0, query));
    if (a.path.size() < 2 || a.path[0] != '/')
      bad_url(option, "a unix:// address needs an absolute socket path");
    if (query != std::string_view::npos) {
      const std::string_view q = rest.substr(query + 1);
      if (q.substr(0, 3) != "db=") bad_url(option, "the only query a unix:// address takes is db=N");
      a.db = parse_int(q.substr(3), 0, 1 << 20, option, "database");
    }
    return a;
  }
  if (take_scheme("rediss://"))
    bad_url(option,
            "rediss:// (TLS) is not supported by this build; reach the store over a private network or a "
            "unix socket, or put a TLS tunnel in front of it");
  if (!take_scheme("redis://")) bad_url(option, "unknown scheme in '" + url.substr(0, url.find("://")) + "'");
  // The credentials end at the authority's '@' (RFC 3986: '@' and '/' in them are percent-encoded).
  if (const size_t at = rest.substr(0, rest.find('/')).find('@'); at != std::string_view::npos) {
    parse_credentials(rest.substr(0, at), a, option);
    rest.remove_prefix(at + 1);
  }
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos && slash + 1 < rest.size())
    a.db = parse_int(rest.substr(slash + 1), 0, 1 << 20, option, "database");
  size_t port_colon = hostport.rfind(':');
  if (hostport.substr(0, 1) == "[") {  // [IPv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) bad_url(option, "an IPv6 address without its ']'");
    a.host = std::string(hostport.substr(1, close - 1));
    port_colon = close + 1 < hostport.size() ? close + 1 : std::string_view::npos;
    if (port_colon != std::string_view::npos && hostport[port_colon] != ':')
      bad_url(option, "junk after ']'");
  } else {
    a.host = std::string(hostport.substr(0, port_colon));
  }
  if (a.host.empty()) bad_url(option, "no host");
  const bool v6 = a.host.find(':') != std::string::npos;
  if (a.host.find_first_not_of(v6 ? "0123456789abcdefABCDEF:."
                                  : "0123456789abcdefghijklmnopqrstuvwxyz"
                                    "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-_") != std::string::npos)
    bad_url(option, "the host is not a name or an address");
  if (port_colon != std::string_view::npos)
    a.port = parse_int(hostport.substr(port_colon + 1), 1, 65535, option, "port");
  return a;
}

std::string RedisAddress::redacted() const {
  std::string out = unix_socket ? "unix://" : "redis://";
  if (!user.empty() || !password.empty()) out.append(user).append(password.empty() ? "" : ":***").append("@");
  const std::string db_text = std::to_string(db);
  if (unix_socket) {
    out.append(path);
    if (db != 0) out.append("?db=").append(db_text);
    return out;
  }
  const bool v6 = host.find(':') != std::string::npos;
  out.append(v6 ? "[" : "").append(host).append(v6 ? "]" : "").append(":").append(std::to_string(port));
  if (db != 0) out.append("/").append(db_text);
  return out;
}

RedisConnection::RedisConnection(const RedisAddress& a, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  c_ = a.unix_socket ? redisConnectUnixWithTimeout(a.path.c_str(), tv)
                     : redisConnectWithTimeout(a.host.c_str(), a.port, tv);
  if (c_ == nullptr) throw RedisUnavailable("out of memory for a connection");
  if (c_->err) {
    const std::string why = c_->errstr;
    redisFree(c_);
    throw RedisUnavailable("cannot connect: " + why);
  }
  if (redisSetTimeout(c_, tv) != REDIS_OK) {
    redisFree(c_);
    throw RedisUnavailable("cannot set the timeout");
  }
  try {
    const std::string db = std::to_string(a.db);  // the commands below are views: it outlives them
    std::vector<RedisCommand> hello;
    if (!a.user.empty() || !a.password.empty()) {
      if (a.user.empty())
        hello.push_back({"AUTH", a.password});
      else
        hello.push_back({"AUTH", a.user, a.password});
    }
    if (a.db != 0) hello.push_back({"SELECT", db});
    hello.push_back({"PING"});
    // The server's own words (WRONGPASS, NOAUTH, ...) never repeat the password.
    for (const RedisReply& r : pipeline(hello))
      if (r.type == RedisReply::Type::kError) throw RedisUnavailable("the server refused: " + r.str);
  } catch (...) {
    redisFree(c_);
    throw;
  }
}

RedisConnection::~RedisConnection() { redisFree(c_); }

std::vector<RedisReply> RedisConnection::pipeline(const std::vector<RedisCommand>& commands) {
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  for (const RedisCommand& cmd : commands) {
    argv.clear();
    argvlen.clear();
    for (std::string_view arg : cmd) {
      argv.push_back(arg.data());
      argvlen.push_back(arg.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), argvlen.data()) != REDIS_OK)
      throw RedisUnavailable(std::string("cannot queue a command: ") + c_->errstr);
  }
  std::vector<RedisReply> out;
  out.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(c_, &raw) != REDIS_OK || raw == nullptr) {
      const bool timed_out = c_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      throw RedisUnavailable(timed_out ? std::string("no reply within the timeout")
                             : c_->err ? std::string(c_->errstr)
                                       : std::string("no reply"));
    }
    auto* r = static_cast<redisReply*>(raw);
    out.push_back(convert(r));
    freeReplyObject(r);
  }
  return out;
}

}  // namespace anchorkv::serve
