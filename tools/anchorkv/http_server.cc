#include "http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <optional>
#include <string_view>
#include <system_error>

#include "anchorkv/status.h"
#include "core/error.h"
#include "serve/http_head.h"

namespace anchorkv::cli {
namespace {

constexpr const char* kOp = "anchorkv serve";
constexpr size_t kMaxChunkLine = 4096;       // a chunk's size line with its extensions
constexpr size_t kLingerBytes = 64 << 10;    // read and dropped after a refusal, so the answer is not reset
constexpr int kLingerMs = 500;

const char* reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

// An OpenAI-style error for refusals made before any handler ran.
HttpResponse refusal(int status, const std::string& message) {
  return {status, "application/json",
          R"({"error":{"message":")" + json_escape(message) + R"(","type":"invalid_request_error","param":null,"code":null}})",
          {}, {}};
}

std::string http_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

// Whether the peer closed its side or reset the connection (a pipelined next
// request is not a close).
bool socket_closed(int fd) {
  char b;
  const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// Sends all of `data`, waiting at most `timeout_ms` each time the socket is
// full; false when the client is gone or reads too slowly.
bool send_all(int fd, std::string_view data, int timeout_ms) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

// A client's bytes, buffered: what was read past one request stays for the
// next (pipelining).
class Reader {
 public:
  Reader(int fd, int timeout_ms) : fd_(fd), timeout_ms_(timeout_ms) {}
  // Reads more; false at the end of the stream, on an error, or after
  // timeout_ms without a byte.
  bool fill() {
    pollfd p{fd_, POLLIN, 0};
    for (;;) {
      const int r = ::poll(&p, 1, timeout_ms_);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      break;
    }
    char tmp[16384];
    ssize_t n;
    do {
      n = ::recv(fd_, tmp, sizeof tmp, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  std::string_view available() const { return std::string_view(buf_).substr(pos_); }
  void consume(size_t n) {
    pos_ += n;
    if (pos_ > (64 << 10) && pos_ * 2 > buf_.size()) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
  }
  // A line ending in CRLF of at most `limit` bytes (without it); nothing
  // when the stream ends first or the line is longer.
  std::optional<std::string> line(size_t limit) {
    for (;;) {
      const std::string_view a = available();
      if (const size_t end = a.find("\r\n"); end != std::string_view::npos) {
        if (end > limit) return std::nullopt;
        std::string out(a.substr(0, end));
        consume(end + 2);
        return out;
      }
      if (a.size() > limit + 1 || !fill()) return std::nullopt;
    }
  }
  // Exactly n bytes appended to `out`.
  bool take(size_t n, std::string& out) {
    while (available().size() < n)
      if (!fill()) return false;
    out.append(available().substr(0, n));
    consume(n);
    return true;
  }

 private:
  int fd_, timeout_ms_;
  std::string buf_;
  size_t pos_ = 0;
};

// A streamed body: the producer thread appends pieces, the connection's
// thread takes them out and sends them.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pending;
  bool done = false, gone = false;

  bool write(const std::string& piece) {
    std::lock_guard lock(mu);
    if (gone) return false;
    pending.push_back(piece);
    cv.notify_all();
    return true;
  }
  bool is_gone() {
    std::lock_guard lock(mu);
    return gone;
  }
  void set_gone() {
    std::lock_guard lock(mu);
    gone = true;
  }
};

sockaddr_storage resolve(const std::string& host, int port, socklen_t* len) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    core::fail(ErrorCode::kIo, kOp, "cannot resolve --host '" + host + "': " + ::gai_strerror(rc));
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return addr;
}

std::string peer_address(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

struct HttpServer::Connection {
  int fd = -1;
  std::string peer;
  std::thread thread;
  std::atomic<bool> done{false};
};

// One connection's life: requests read, answered and streamed in turn until
// the client closes, a request asks to close, a refusal closes, or the
// server stops.
struct ConnectionLoop {
  HttpServer& srv;
  HttpServer::Connection& conn;
  Reader in;

  ConnectionLoop(HttpServer& s, HttpServer::Connection& c)
      : srv(s), conn(c), in(c.fd, static_cast<int>(s.limits_.idle_timeout_s) * 1000) {}

  int send_timeout_ms() const { return static_cast<int>(srv.limits_.idle_timeout_s) * 1000; }

  void run() {
    while (!srv.stopping_ && one_request()) {
    }
  }

  // The head of the next request; nothing when the client closed or went
  // silent first (nothing is answered then).
  std::optional<serve::HttpHead> read_head() {
    for (int blank = 0;; ++blank) {  // RFC 9112 2.2: empty lines before a request line are ignored
      while (in.available().size() < 2)
        if (!in.fill()) return std::nullopt;
      if (in.available().substr(0, 2) != "\r\n" || blank >= 4) break;
      in.consume(2);
    }
    for (;;) {
      const std::string_view a = in.available();
      const size_t end = a.find("\r\n\r\n");
      if (end != std::string_view::npos) {
        if (end + 4 > srv.limits_.header_memory) return serve::refused_head(431, "the request head is too large");
        serve::HttpHead h = serve::parse_http_head(a.substr(0, end));
        in.consume(end + 4);
        return h;
      }
      if (a.size() > srv.limits_.header_memory) return serve::refused_head(431, "the request head is too large");
      if (!in.fill()) return std::nullopt;
    }
  }

  // The body; a nonzero status when it must be refused.
  int read_body(const serve::HttpHead& h, std::string& body) {
    if (h.content_length) {
      if (*h.content_length > srv.limits_.max_body) return 413;
      if (h.expect_continue && *h.content_length > 0 && !send_all(conn.fd, "HTTP/1.1 100 Continue\r\n\r\n", send_timeout_ms()))
        return -1;
      return in.take(*h.content_length, body) ? 0 : -1;
    }
    if (!h.chunked) return 0;
    if (h.expect_continue && !send_all(conn.fd, "HTTP/1.1 100 Continue\r\n\r\n", send_timeout_ms())) return -1;
    for (;;) {
      const std::optional<std::string> line = in.line(kMaxChunkLine);
      if (!line) return 400;
      const std::optional<uint64_t> chunk = serve::parse_chunk_size(*line);
      if (!chunk) return 400;
      const uint64_t size = *chunk;
      if (size == 0) break;
      if (body.size() + size > srv.limits_.max_body) return 413;
      if (!in.take(size, body)) return -1;
      const std::optional<std::string> end = in.line(0);
      if (!end) return 400;  // the chunk's data is not followed by CRLF
    }
    size_t trailers = 0;  // trailer fields are read and dropped, within the head's limit
    for (;;) {
      const std::optional<std::string> line = in.line(srv.limits_.header_memory);
      if (!line) return 400;
      if (line->empty()) return 0;
      trailers += line->size() + 2;
      if (trailers > srv.limits_.header_memory) return 431;
    }
  }

  // Answers a refusal, then closes: what the client still sends is read
  // and dropped for a moment, so the answer is not lost to a reset.
  void refuse_and_close(int status, const std::string& why, bool head_only = false) {
    ++srv.refused_;
    HttpResponse r = refusal(status, why);
    if (status == 503) r.headers.push_back({"Retry-After", "1"});
    send_response(r, /*close=*/true, head_only);
    ::shutdown(conn.fd, SHUT_WR);
    char buf[4096];
    size_t dropped = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMs);
    while (dropped < kLingerBytes && std::chrono::steady_clock::now() < until) {
      pollfd p{conn.fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(conn.fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      dropped += static_cast<size_t>(n);
    }
  }

  bool send_response(const HttpResponse& r, bool close, bool head_only) {
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason(r.status) + "\r\n";
    out += "Date: " + http_date() + "\r\nContent-Type: " + r.content_type + "\r\n";
    for (const auto& [k, v] : r.headers)
      if (serve::lower(k) != "connection" && serve::lower(k) != "content-length" && serve::lower(k) != "transfer-encoding")
        out += k + ": " + v + "\r\n";
    out += r.produce ? std::string("Transfer-Encoding: chunked\r\n")
                     : "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    if (close) out += "Connection: close\r\n";
    out += "\r\n";
    if (!r.produce && !head_only) out += r.body;
    return send_all(conn.fd, out, send_timeout_ms());
  }

  // Sends a streamed body while its producer runs; false when the client
  // went away (the producer is told and joined either way).
  bool stream(HttpResponse& r) {
    Stream s;
    std::thread producer([&s, produce = std::move(r.produce)] {
      try {
        produce([&s](const std::string& piece) { return s.write(piece); }, [&s] { return s.is_gone(); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "anchorkv serve: a stream failed: %s\n", e.what());
      }
      std::lock_guard lock(s.mu);
      s.done = true;
      s.cv.notify_all();
    });
    bool ok = true;
    for (;;) {
      std::unique_lock lock(s.mu);
      if (s.pending.empty() && !s.done) {
        if (s.cv.wait_for(lock, std::chrono::milliseconds(100)) == std::cv_status::timeout &&
            (socket_closed(conn.fd) || srv.stopping_)) {
          ok = false;
          break;
        }
        continue;
      }
      if (s.pending.empty()) break;  // done
      std::string piece = std::move(s.pending.front());
      s.pending.pop_front();
      lock.unlock();
      if (piece.empty()) continue;
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      if (!send_all(conn.fd, size + piece + "\r\n", send_timeout_ms())) {
        ok = false;
        break;
      }
    }
    if (!ok) s.set_gone();
    producer.join();
    return ok && send_all(conn.fd, "0\r\n\r\n", send_timeout_ms());
  }

  // One request; false when the connection is to be closed.
  bool one_request() {
    std::optional<serve::HttpHead> head = read_head();
    if (!head) return false;
    if (head->status) {
      refuse_and_close(head->status, head->why);
      return false;
    }
    HttpRequest req;
    req.method = head->method;
    req.path = head->path;
    req.headers = std::move(head->headers);
    const bool allowed = !srv.draining_ || srv.while_draining(req.path);
    if (!allowed) {
      refuse_and_close(503, "the server is shutting down; retry shortly", req.method == "HEAD");
      return false;
    }
    struct InFlight {
      HttpServer& s;
      explicit InFlight(HttpServer& srv) : s(srv) {
        std::lock_guard lock(s.mu_);
        ++s.in_flight_;
      }
      ~InFlight() {
        std::lock_guard lock(s.mu_);
        if (--s.in_flight_ == 0) s.idle_.notify_all();
      }
    } in_flight(srv);
    if (const int status = read_body(*head, req.body); status != 0) {
      if (status > 0)
        refuse_and_close(status, status == 413 ? "request body too large" : "malformed chunked body");
      return false;
    }
    const int fd = conn.fd;
    HttpServer* s = &srv;
    req.client_gone = [fd, s] { return s->stopping_ || socket_closed(fd); };
    HttpResponse resp = srv.handle(req);
    const bool close = !head->keep_alive || srv.draining_ ||
                       std::any_of(resp.headers.begin(), resp.headers.end(), [](const auto& h) {
                         return serve::lower(h.first) == "connection" && serve::has_token(h.second, "close");
                       });
    if (!send_response(resp, close, req.method == "HEAD")) return false;
    if (resp.produce && !stream(resp)) return false;
    return !close;
  }
};

HttpServer::HttpServer(HttpLimits limits) : limits_(limits) {
  fallback_ = [](const HttpRequest&) { return refusal(404, "no such endpoint"); };
  on_exception_ = [](const std::string&) {
    return HttpResponse{500, "application/json",
                        R"({"error":{"message":"internal error","type":"server_error","param":null,"code":null}})",
                        {}, {}};
  };
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler h) {
  routes_[{method, path}] = std::move(h);
}

bool HttpServer::while_draining(const std::string& path) const {
  std::lock_guard lock(mu_);
  return while_draining_.count(path) > 0;
}

HttpResponse HttpServer::handle(const HttpRequest& req) const {
  auto it = routes_.find({req.method, req.path});
  try {
    return it != routes_.end() ? it->second(req) : fallback_(req);
  } catch (const std::exception& e) {
    return on_exception_(e.what());
  } catch (...) {
    return on_exception_("unknown exception");
  }
}

void HttpServer::start(const std::string& host, int port) {
  socklen_t len = 0;
  const sockaddr_storage addr = resolve(host, port, &len);
  listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  // SO_REUSEADDR only, never SO_REUSEPORT: a second server on the port fails.
  if (listen_fd_ < 0 || ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || ::listen(listen_fd_, 512) != 0) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    core::fail(ErrorCode::kIo, kOp,
               "cannot listen on " + host + ":" + std::to_string(port) + " (" + why +
                   "; is another server on that port?)");
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  acceptor_ = std::thread([this] { accept_loop(); });
}

bool HttpServer::admit(const std::string& peer) {
  std::lock_guard lock(mu_);
  const auto open = std::count_if(connections_.begin(), connections_.end(), [](const auto& c) { return !c->done; });
  if (open >= static_cast<std::ptrdiff_t>(limits_.max_connections)) return false;
  unsigned& from_peer = per_ip_[peer];
  if (limits_.per_ip_connections > 0 && from_peer >= limits_.per_ip_connections) return false;
  ++from_peer;
  return true;
}

// Joins the threads of finished connections and closes their sockets (all
// of them when stopping).
void HttpServer::reap(bool all) {
  std::vector<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (all || (*it)->done) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    c->thread.join();
    ::close(c->fd);
  }
}

void HttpServer::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int r = ::poll(fds, 2, 1000);
    if (stopping_) break;
    reap(false);
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    sockaddr_storage a{};
    socklen_t alen = sizeof a;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &alen, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const std::string peer = peer_address(a);
    if (!admit(peer)) {
      ++refused_;
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->peer = peer;
    Connection* raw = c.get();
    std::lock_guard lock(mu_);
    try {
      raw->thread = std::thread([this, raw] {
        ConnectionLoop(*this, *raw).run();
        ::shutdown(raw->fd, SHUT_RDWR);
        std::lock_guard l(mu_);
        if (--per_ip_[raw->peer] == 0) per_ip_.erase(raw->peer);
        raw->done = true;
      });
    } catch (const std::system_error&) {  // no thread to be had (a process or memory limit): refused
      ++refused_;
      if (--per_ip_[peer] == 0) per_ip_.erase(peer);
      ::close(fd);
      continue;
    }
    connections_.push_back(std::move(c));
  }
}

void HttpServer::drain(std::set<std::string> while_draining) {
  {
    std::lock_guard lock(mu_);
    while_draining_ = std::move(while_draining);
  }
  draining_ = true;
}

bool HttpServer::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return idle_.wait_until(lock, deadline, [&] { return in_flight_ == 0; });
}

void HttpServer::stop() {
  if (listen_fd_ < 0 || stopping_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  acceptor_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  {
    std::lock_guard lock(mu_);
    for (const auto& c : connections_) ::shutdown(c->fd, SHUT_RDWR);  // wakes their reads
  }
  reap(/*all=*/true);
}

}  // namespace anchorkv::cli
