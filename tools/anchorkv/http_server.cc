#include "http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "anchorkv/status.h"
#include "core/error.h"

namespace anchorkv::cli {
namespace {

constexpr const char* kOp = "anchorkv serve";

// Whether the peer closed its side or reset the connection (a pipelined next
// request is not a close).
bool socket_closed(int fd) {
  char b;
  const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int connection_fd(MHD_Connection* c) {
  const MHD_ConnectionInfo* ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

MHD_Result collect_header(void* cls, MHD_ValueKind, const char* key, const char* value) {
  std::string k = key;
  std::transform(k.begin(), k.end(), k.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  (*static_cast<std::map<std::string, std::string>*>(cls))[k] = value ? value : "";
  return MHD_YES;
}

// A streamed body: the producer thread appends pieces, the connection's
// thread (in MHD's content reader) takes them out and sends them.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pending;
  bool done = false, gone = false;
  int fd = -1;
  std::thread producer;

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
  // MHD's content reader: the next bytes, waiting for the producer; while
  // waiting, checks every 100 ms that the client is still there.
  ssize_t read(char* buf, size_t max) {
    std::unique_lock lock(mu);
    while (pending.empty() && !done) {
      if (cv.wait_for(lock, std::chrono::milliseconds(100)) == std::cv_status::timeout && socket_closed(fd)) {
        gone = true;
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    if (pending.empty()) return MHD_CONTENT_READER_END_OF_STREAM;
    std::string& front = pending.front();
    const size_t n = std::min(max, front.size());
    std::memcpy(buf, front.data(), n);
    if (n == front.size())
      pending.pop_front();
    else
      front.erase(0, n);
    return static_cast<ssize_t>(n);
  }
  // MHD is done with the response (sent, or the client went away).
  void finish() {
    {
      std::lock_guard lock(mu);
      gone = true;
    }
    if (producer.joinable()) producer.join();
  }
};

ssize_t stream_read(void* cls, uint64_t, char* buf, size_t max) { return static_cast<Stream*>(cls)->read(buf, max); }
void stream_free(void* cls) {
  auto* s = static_cast<Stream*>(cls);
  s->finish();
  delete s;
}

MHD_Result queue(MHD_Connection* c, const HttpResponse& r) {
  MHD_Response* resp = MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()),
                                                       MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
  for (const auto& [k, v] : r.headers) MHD_add_response_header(resp, k.c_str(), v.c_str());
  const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), resp);
  MHD_destroy_response(resp);
  return ok;
}

MHD_Result queue_stream(MHD_Connection* c, HttpResponse r) {
  auto* s = new Stream;
  s->fd = connection_fd(c);
  MHD_Response* resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
  if (!resp) {
    delete s;
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
  for (const auto& [k, v] : r.headers) MHD_add_response_header(resp, k.c_str(), v.c_str());
  s->producer = std::thread([s, produce = std::move(r.produce)] {
    produce([s](const std::string& piece) { return s->write(piece); }, [s] { return s->is_gone(); });
    std::lock_guard lock(s->mu);
    s->done = true;
    s->cv.notify_all();
  });
  const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), resp);
  MHD_destroy_response(resp);  // MHD holds its own reference until the stream ends
  return ok;
}

// An oversized body seen mid-upload: MHD cannot queue a response while it
// delivers upload data, so the 413 goes out directly and the connection closes.
void send_raw_413(MHD_Connection* c) {
  static const char kMsg[] =
      "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
      "Content-Length: 95\r\n\r\n"
      R"({"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":null}})";
  const int fd = connection_fd(c);
  if (fd >= 0) (void)::send(fd, kMsg, sizeof(kMsg) - 1, MSG_NOSIGNAL);
}

sockaddr_storage resolve(const std::string& host, int port, bool* ipv6) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    core::fail(ErrorCode::kIo, kOp, "cannot resolve --host '" + host + "': " + ::gai_strerror(rc));
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  *ipv6 = res->ai_family == AF_INET6;
  ::freeaddrinfo(res);
  return addr;
}

}  // namespace

struct HttpServer::Call {
  std::string body;
};

struct Dispatch {
  static MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method, const char*,
                               const char* upload, size_t* upload_size, void** con_cls) {
    auto* srv = static_cast<HttpServer*>(cls);
    if (!*con_cls) {
      *con_cls = new HttpServer::Call;
      const char* length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if (length && std::strtoull(length, nullptr, 10) > srv->limits_.max_body) {
        ++srv->refused_;
        return queue(c, too_large());
      }
      return MHD_YES;
    }
    auto* call = static_cast<HttpServer::Call*>(*con_cls);
    if (*upload_size > 0) {
      if (call->body.size() + *upload_size > srv->limits_.max_body) {  // chunked, past the limit
        ++srv->refused_;
        send_raw_413(c);
        return MHD_NO;
      }
      call->body.append(upload, *upload_size);
      *upload_size = 0;
      (void)upload;
      return MHD_YES;
    }
    HttpRequest req;
    req.method = method;
    req.path = url;
    req.body = std::move(call->body);
    MHD_get_connection_values(c, MHD_HEADER_KIND, collect_header, &req.headers);
    const int fd = connection_fd(c);
    req.client_gone = [fd, srv] { return srv->stopping_ || (fd >= 0 && socket_closed(fd)); };
    HttpResponse resp = srv->handle(req);
    return resp.produce ? queue_stream(c, std::move(resp)) : queue(c, resp);
  }

  static void on_completed(void*, MHD_Connection*, void** con_cls, MHD_RequestTerminationCode) {
    delete static_cast<HttpServer::Call*>(*con_cls);
    *con_cls = nullptr;
  }

  static HttpResponse too_large() {
    return {413, "application/json",
            R"({"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":null}})",
            {}, {}};
  }
};

HttpServer::HttpServer(HttpLimits limits) : limits_(limits) {
  fallback_ = [](const HttpRequest&) {
    return HttpResponse{404, "application/json",
                        R"({"error":{"message":"no such endpoint","type":"not_found_error","param":null,"code":null}})",
                        {}, {}};
  };
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
  bool ipv6 = false;
  sockaddr_storage addr = resolve(host, port, &ipv6);
  const unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                         (ipv6 ? MHD_USE_IPv6 : 0);
  daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(port), nullptr, nullptr, &Dispatch::on_request, this,
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&addr),                      //
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, limits_.header_memory,                     //
      MHD_OPTION_CONNECTION_LIMIT, limits_.max_connections,                          //
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, limits_.per_ip_connections,                //
      MHD_OPTION_CONNECTION_TIMEOUT, limits_.idle_timeout_s,                         //
      MHD_OPTION_NOTIFY_COMPLETED, &Dispatch::on_completed, nullptr,                 //
      MHD_OPTION_END);  // SO_REUSEADDR only, never SO_REUSEPORT: a second server on the port fails
  if (!daemon_)
    core::fail(ErrorCode::kIo, kOp,
               "cannot listen on " + host + ":" + std::to_string(port) + " (" + std::strerror(errno) +
                   "; is another server on that port?)");
}

void HttpServer::stop() {
  if (!daemon_) return;
  stopping_ = true;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace anchorkv::cli
