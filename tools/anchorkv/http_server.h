// A small HTTP/1.1 server for `anchorkv serve`: one thread per connection (a
// slow or stalled client holds only its own thread, never /health's), every
// request head bounded before it is parsed, bodies (Content-Length or
// chunked) bounded before they are buffered, idle connections closed, at
// most `max_connections` at once, and the port bound exclusively. Handlers
// run on the connection's thread; a streamed body is produced on a thread of
// its own while the connection's thread sends it, so a client that goes away
// is noticed even while nothing is being written.
//
// Framing is parsed strictly (RFC 9112): a request whose length could be
// read two ways is refused with 400 and its connection closed, never guessed
// at — a Content-Length that is not a plain decimal number or appears twice,
// Content-Length together with Transfer-Encoding, a transfer coding other
// than chunked, a header name with white space before its colon, a folded
// header line, a bare CR or LF, a missing or repeated Host. Behind a proxy
// that reads such a request differently that is request smuggling; the
// library this replaces (libmicrohttpd 0.9.75) accepted the first three and
// sent its own error responses twice.
//
// Draining (a rolling restart): after drain(), requests that arrive get 503
// with `Connection: close` and `Retry-After`, except the paths named
// `while_draining` (health, which answers for itself); requests already
// running go on, and wait_idle() says when none is left.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace anchorkv::cli {

struct HttpLimits {
  size_t max_body = 1 << 20;            // request body bytes (413 beyond)
  size_t header_memory = 32 << 10;      // per request: request line + headers (431 beyond)
  unsigned max_connections = 256;       // open at once; more are refused at accept
  unsigned per_ip_connections = 0;      // open at once from one address (0: no limit)
  unsigned idle_timeout_s = 15;         // a connection silent this long is closed
};

struct HttpRequest {
  std::string method, path, body;
  std::map<std::string, std::string> headers;  // names lower-case
  // True once the client has closed its side or reset the connection, or the
  // server is stopping.
  std::function<bool()> client_gone;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the body is streamed (chunked): `produce(write)` runs on a
  // thread of its own, `write(piece)` returns false once the client is gone,
  // and the response ends when produce returns. `gone()` tells the producer
  // the same without writing.
  std::function<void(const std::function<bool(const std::string&)>& write, const std::function<bool()>& gone)>
      produce;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  explicit HttpServer(HttpLimits limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes are exact paths (the query string is not part of the path); other
  // paths get `fallback` (a 404 by default).
  void route(const std::string& method, const std::string& path, HttpHandler h);
  void fallback(HttpHandler h) { fallback_ = std::move(h); }
  // Answers when a handler throws: the exception's message (a 500 by default).
  void on_exception(std::function<HttpResponse(const std::string& what)> f) { on_exception_ = std::move(f); }
  // Starts listening (IPv4 or IPv6 address, or a host name). Throws
  // Error(kIo) when the address cannot be bound, e.g. a port in use.
  void start(const std::string& host, int port);
  // From now on, requests for paths other than `while_draining` get 503;
  // keep-alive connections close after the response they are on.
  void drain(std::set<std::string> while_draining);
  bool draining() const { return draining_; }
  // Waits until no request is being handled or streamed, or `deadline`;
  // true when none is.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Stops accepting, closes every connection and waits for their threads
  // (handlers see client_gone() from now on).
  void stop();
  bool stopping() const { return stopping_; }
  // Requests refused before a handler ran (too large, malformed, draining).
  int64_t refused() const { return refused_; }

  struct Connection;  // one client's socket and thread (http_server.cc)

 private:
  friend struct ConnectionLoop;
  HttpResponse handle(const HttpRequest& req) const;
  bool while_draining(const std::string& path) const;
  void accept_loop();
  void reap(bool all);
  bool admit(const std::string& peer);

  HttpLimits limits_;
  std::map<std::pair<std::string, std::string>, HttpHandler> routes_;
  HttpHandler fallback_;
  std::function<HttpResponse(const std::string&)> on_exception_;
  int listen_fd_ = -1, wake_fd_ = -1;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false}, draining_{false};
  std::atomic<int64_t> refused_{0};

  mutable std::mutex mu_;  // connections, per-address counts, in-flight requests, drain paths
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::map<std::string, unsigned> per_ip_;
  int in_flight_ = 0;
  std::set<std::string> while_draining_;
};

}  // namespace anchorkv::cli
