#include "serve/redis_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

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

// ---------------------------------------------------------------- the protocol

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLine = 64 << 10;  // a status, error or length line
constexpr int kMaxDepth = 4;           // arrays within arrays (the store's replies are at most 1 deep)

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Waits until `fd` is ready for `events` or `deadline` passes.
void wait_for(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw RedisUnavailable(std::string("no ") + what + " within the timeout");
    throw RedisUnavailable(std::string("poll: ") + std::strerror(errno));
  }
}

void append_command(std::string& out, const RedisCommand& cmd) {
  out += '*';
  out += std::to_string(cmd.size());
  out += "\r\n";
  for (std::string_view arg : cmd) {
    out += '$';
    out += std::to_string(arg.size());
    out += "\r\n";
    out.append(arg);
    out += "\r\n";
  }
}

}  // namespace

// Replies from the socket: lines and lengths checked before anything is
// allocated, bulk strings received straight into their reply.
class RedisConnection::Reader {
 public:
  Reader(int fd, std::string& buffered, const RedisLimits& limits, Clock::time_point deadline)
      : fd_(fd), buf_(buffered), limits_(limits), deadline_(deadline) {}

  RedisReply reply(int depth = 0) {
    const std::string line = read_line();
    if (line.empty()) throw RedisUnavailable("not the Redis protocol (an empty line)");
    const std::string_view rest = std::string_view(line).substr(1);
    RedisReply r;
    switch (line[0]) {
      case '+':
        r.type = RedisReply::Type::kString;
        r.str = rest;
        return r;
      case '-':
        r.type = RedisReply::Type::kError;
        r.str = rest;
        return r;
      case ':':
        r.type = RedisReply::Type::kInteger;
        r.integer = number(rest);
        return r;
      case '$': return bulk(number(rest));
      case '*': return array(number(rest), depth);
      default: throw RedisUnavailable("not the Redis protocol (an unknown reply type)");
    }
  }

 private:
  static int64_t number(std::string_view s) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
      throw RedisUnavailable("not the Redis protocol (a malformed number)");
    return v;
  }

  RedisReply bulk(int64_t n) {
    RedisReply r;
    if (n < 0) return r;  // nil
    if (static_cast<uint64_t>(n) > limits_.max_bulk || total_ + static_cast<uint64_t>(n) > limits_.max_total) {
      r.type = RedisReply::Type::kTooLarge;
      r.integer = n;
      return r;
    }
    total_ += static_cast<size_t>(n);
    r.type = RedisReply::Type::kString;
    r.str.resize(static_cast<size_t>(n));
    const size_t from_buffer = std::min(buf_.size(), r.str.size());
    std::memcpy(r.str.data(), buf_.data(), from_buffer);
    buf_.erase(0, from_buffer);
    for (size_t got = from_buffer; got < r.str.size();) got += receive(r.str.data() + got, r.str.size() - got);
    if (read_exactly(2) != "\r\n") throw RedisUnavailable("not the Redis protocol (a bulk string's end)");
    return r;
  }

  RedisReply array(int64_t n, int depth) {
    RedisReply r;
    if (n < 0) return r;  // nil
    if (static_cast<uint64_t>(n) > limits_.max_elements || depth >= kMaxDepth) {
      r.type = RedisReply::Type::kTooLarge;
      r.integer = n;
      return r;
    }
    r.type = RedisReply::Type::kArray;
    r.items.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      r.items.push_back(reply(depth + 1));
      if (r.items.back().type == RedisReply::Type::kTooLarge) {
        r.type = RedisReply::Type::kTooLarge;
        r.items.clear();
        return r;
      }
    }
    return r;
  }

  std::string read_line() {
    for (size_t scanned = 0;;) {
      const size_t end = buf_.find("\r\n", scanned > 0 ? scanned - 1 : 0);
      if (end != std::string::npos) {
        std::string line = buf_.substr(0, end);
        buf_.erase(0, end + 2);
        return line;
      }
      if (buf_.size() > kMaxLine) throw RedisUnavailable("not the Redis protocol (a line too long)");
      scanned = buf_.size();
      fill();
    }
  }

  std::string read_exactly(size_t n) {
    while (buf_.size() < n) fill();
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }

  void fill() {
    char tmp[16384];
    const size_t n = receive(tmp, sizeof tmp);
    buf_.append(tmp, n);
  }

  // At least one byte into `out`, waiting until the deadline.
  size_t receive(char* out, size_t max) {
    for (;;) {
      const ssize_t n = ::recv(fd_, out, max, MSG_DONTWAIT);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) throw RedisUnavailable("the server closed the connection");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throw RedisUnavailable(std::string("recv: ") + std::strerror(errno));
      wait_for(fd_, POLLIN, deadline_, "reply");
    }
  }

  int fd_;
  std::string& buf_;
  const RedisLimits& limits_;
  const Clock::time_point deadline_;
  size_t total_ = 0;
};

RedisConnection::RedisConnection(const RedisAddress& a, Clock::time_point deadline, RedisLimits limits)
    : limits_(limits) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (a.unix_socket) {
    sockaddr_un u{};
    u.sun_family = AF_UNIX;
    if (a.path.size() >= sizeof u.sun_path) throw RedisUnavailable("the socket path is too long");
    std::memcpy(u.sun_path, a.path.c_str(), a.path.size() + 1);
    std::memcpy(&addr, &u, sizeof u);
    len = sizeof u;
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = ::getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &res);
    if (rc != 0 || !res) throw RedisUnavailable(std::string("cannot resolve the host: ") + ::gai_strerror(rc));
    std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
    len = res->ai_addrlen;
    ::freeaddrinfo(res);
  }
  fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw RedisUnavailable(std::string("socket: ") + std::strerror(errno));
  try {
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      if (errno != EINPROGRESS && errno != EAGAIN) throw RedisUnavailable(std::string("cannot connect: ") + std::strerror(errno));
      wait_for(fd_, POLLOUT, deadline, "connection");
      int err = 0;
      socklen_t elen = sizeof err;
      ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &elen);
      if (err != 0) throw RedisUnavailable(std::string("cannot connect: ") + std::strerror(err));
    }
    if (!a.unix_socket) {
      const int one = 1;
      ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
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
    for (const RedisReply& r : pipeline(hello, deadline))
      if (r.type == RedisReply::Type::kError || r.type == RedisReply::Type::kTooLarge)
        throw RedisUnavailable("the server refused: " + r.str);
    if (broken()) throw RedisUnavailable("the connection broke while greeting");
  } catch (...) {
    close_fd();
    throw;
  }
}

RedisConnection::~RedisConnection() { close_fd(); }

void RedisConnection::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RedisConnection::send_all(const std::string& bytes, Clock::time_point deadline) {
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_for(fd_, POLLOUT, deadline, "room to send");
      continue;
    }
    throw RedisUnavailable(std::string("send: ") + std::strerror(errno));
  }
}

std::vector<RedisReply> RedisConnection::pipeline(const std::vector<RedisCommand>& commands,
                                                  Clock::time_point deadline) {
  if (fd_ < 0) throw RedisUnavailable("the connection is closed");
  std::vector<RedisReply> out;
  try {
    std::string request;
    for (const RedisCommand& cmd : commands) append_command(request, cmd);
    send_all(request, deadline);
    request.clear();
    request.shrink_to_fit();
    Reader in(fd_, buffered_, limits_, deadline);
    out.reserve(commands.size());
    for (size_t i = 0; i < commands.size(); ++i) {
      out.push_back(in.reply());
      if (out.back().type == RedisReply::Type::kTooLarge) {
        close_fd();  // its bytes are still on the wire
        break;
      }
    }
  } catch (...) {
    close_fd();
    throw;
  }
  return out;
}

}  // namespace anchorkv::serve
