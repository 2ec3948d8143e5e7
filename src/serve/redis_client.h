// A connection to a server that speaks the Redis protocol (Redis, Valkey,
// KeyDB), on hiredis, for the shared block store (block_store.h). Only what
// that store needs: an address from a URL, authentication, and pipelines of
// binary-safe commands with a timeout on every read and write.
//
// The password never leaves this file except to the server: the address
// prints redacted, and failures name the operation and the server's words,
// never the credentials. Writing to a socket the server closed raises SIGPIPE;
// a process using this must ignore that signal (`anchorkv serve` does).
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

struct redisContext;

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
// array, or the server's refusal of one command (kError, its text in `str`).
struct RedisReply {
  enum class Type { kNil, kInteger, kString, kArray, kError };
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

class RedisConnection {
 public:
  // Connects within `timeout`, authenticates and selects the database;
  // every later read and write times out after `timeout` too.
  RedisConnection(const RedisAddress& address, std::chrono::milliseconds timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply (one round trip). Throws
  // RedisUnavailable when the connection fails; a command the server
  // refuses comes back as a kError reply.
  std::vector<RedisReply> pipeline(const std::vector<RedisCommand>& commands);

 private:
  redisContext* c_ = nullptr;
};

}  // namespace anchorkv::serve
