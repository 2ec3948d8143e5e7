// A small HTTP/1.1 server for `anchorkv serve`, on GNU libmicrohttpd: one
// thread per connection (a slow or stalled client holds only its own thread,
// never /health's), every connection's header memory bounded, bodies
// (Content-Length or chunked) bounded before they are buffered, idle
// connections closed, at most `max_connections` at once, and the port bound
// exclusively. Handlers run on the connection's thread; a streamed body is
// produced on a thread of its own while the connection's thread sends it, so
// a client that goes away is noticed even while nothing is being written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct MHD_Daemon;

namespace anchorkv::cli {

struct HttpLimits {
  size_t max_body = 1 << 20;            // request body bytes (413 beyond)
  size_t header_memory = 32 << 10;      // per connection: request line + headers + buffers
  unsigned max_connections = 256;       // open at once; more are refused at accept
  unsigned per_ip_connections = 0;      // open at once from one address (0: no limit)
  unsigned idle_timeout_s = 15;         // a connection silent this long is closed
};

struct HttpRequest {
  std::string method, path, body;
  std::map<std::string, std::string> headers;  // names lower-case
  // True once the client has closed its side or reset the connection.
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

  // Routes are exact paths; other paths get `fallback` (a 404 by default).
  void route(const std::string& method, const std::string& path, HttpHandler h);
  void fallback(HttpHandler h) { fallback_ = std::move(h); }
  // Answers when a handler throws: the exception's message (a 500 by default).
  void on_exception(std::function<HttpResponse(const std::string& what)> f) { on_exception_ = std::move(f); }
  // Starts listening (IPv4 or IPv6 address, or a host name). Throws
  // Error(kIo) when the address cannot be bound, e.g. a port in use.
  void start(const std::string& host, int port);
  // Stops accepting, then waits for open connections to finish.
  void stop();
  bool stopping() const { return stopping_; }
  // Requests refused before a handler ran (too large, malformed).
  int64_t refused() const { return refused_; }

  struct Call;  // one request's state (http_server.cc)

 private:
  friend struct Dispatch;
  HttpResponse handle(const HttpRequest& req) const;
  HttpLimits limits_;
  std::map<std::pair<std::string, std::string>, HttpHandler> routes_;
  HttpHandler fallback_;
  std::function<HttpResponse(const std::string&)> on_exception_;
  MHD_Daemon* daemon_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
};

}  // namespace anchorkv::cli
