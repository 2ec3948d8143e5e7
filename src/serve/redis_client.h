// A connection to a server that speaks the Redis protocol (Redis, Valkey,
// KeyDB), for the shared block store (block_store.h). Only what that store
// needs: an address from a URL, authentication, and pipelines of
// binary-safe commands, each round trip within a deadline.
//
// The protocol is read here (RESP2) from a non-blocking socket, every wait a
// poll() against the round trip's deadline, so a store that answers one
// byte at a time costs the deadline and no more; every length it announces
// is checked against the caller's limits before anything is allocated or
// read, and a bulk string is copied once, from the socket into its reply.
// (hiredis 0.14, Debian 12's, has no such limits: it allocated an array
// header's 2^31 pointers and buffered a 500 MB value before any check.)
//
// The password never leaves this file except to the server: the address
// prints redacted, and failures name the operation and the server's words,
// never the credentials. Writes never raise SIGPIPE.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace anchorkv::serve {

// `redis://[user:password@]host[:port][/db]` or `unix://[user:password@]/path[?db=N]`;
// user and password may be percent-encoded.
struct RedisAddress {
  bool unix_socket = false;
  std::string host;  // a name or an address; [::1] style for IPv6
  int port = 6379;
  std::string path;  // the socket, for unix://
  std::string user, password;
  int db = 0;
  // The URL with the password replaced by "***".
  std::string redacted() const;
};

// Throws Error(kInvalidArgument) naming `option` for anything else, an
// unknown scheme included (rediss:// is refused: this build has no TLS).
RedisAddress parse_redis_url(const std::string& url, const std::string& option = "--kv-store");

// A reply: nil (a missing key), an integer, a string (bulk or status), an
// array, the server's refusal of one command (kError, its text in `str`), or
// one larger than the limits (kTooLarge: not read; it ends the pipeline's
// replies and the connection).
struct RedisReply {
  enum class Type { kNil, kInteger, kString, kArray, kError, kTooLarge };
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string str;
  std::vector<RedisReply> items;
};

// The server cannot be reached, timed out, refused the credentials, or sent
// what is not the protocol: the connection is unusable.
struct RedisUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using RedisCommand = std::vector<std::string_view>;  // arguments, binary safe

// What one round trip may read: a bulk string's bytes, an array's elements,
// and the bulk bytes of all its replies together.
struct RedisLimits {
  size_t max_bulk = size_t{64} << 20;
  size_t max_elements = size_t{1} << 16;
  size_t max_total = size_t{256} << 20;
};

class RedisConnection {
 public:
  using Clock = std::chrono::steady_clock;
  // Connects, authenticates and selects the database before `deadline`.
  RedisConnection(const RedisAddress& address, Clock::time_point deadline, RedisLimits limits = {});
  RedisConnection(const RedisAddress& address, std::chrono::milliseconds timeout, RedisLimits limits = {})
      : RedisConnection(address, Clock::now() + timeout, limits) {}
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply, before `deadline` (one
  // round trip). Throws RedisUnavailable when the connection fails, times
  // out or breaks the protocol; a command the server refuses comes back as
  // a kError reply; a reply past the limits comes back as kTooLarge, the
  // last one returned (the connection is then broken()).
  std::vector<RedisReply> pipeline(const std::vector<RedisCommand>& commands, Clock::time_point deadline);
  std::vector<RedisReply> pipeline(const std::vector<RedisCommand>& commands) {
    return pipeline(commands, Clock::now() + std::chrono::seconds(5));
  }
  // Whether the connection is unusable (a reply left unread, a failure).
  bool broken() const { return fd_ < 0; }

 private:
  class Reader;
  void send_all(const std::string& bytes, Clock::time_point deadline);
  void close_fd();
  int fd_ = -1;
  RedisLimits limits_;
  std::string buffered_;  // bytes read past the last reply (none between round trips)
};

}  // namespace anchorkv::serve
