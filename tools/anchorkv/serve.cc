// `anchorkv serve`: an OpenAI-compatible HTTP server (http_server.h, strict
// HTTP/1.1 framing; nlohmann JSON) over serve::Engine — completions and chat
// completions (plain and server-sent events), models, health and Prometheus
// metrics. Every limit is checked before the work it bounds: bytes before
// tokenizing, tokens before prefilling, the queue before waiting.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "anchorkv/status.h"
#include "commands.h"
#include "runtime/model_file.h"
#include "http_server.h"
#include "openai_request.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "serve/chat.h"
#include "serve/engine.h"

namespace anchorkv::cli {
namespace {

using json = nlohmann::json;
constexpr int kMaxChoices = 16;  // n

struct ServeOptions {
  std::string model, host = "127.0.0.1", chat_template, cache_budget = "1GiB", cache_dir_budget = "0";
  int kv_store_timeout_ms = 250;
  int port = 8080, parallel = 1, threads = 0;
  serve::EngineOptions engine;
  HttpLimits http;
  int64_t max_prompt = 0;  // 0: the model's context (at most 8192)
  int64_t max_tokens_limit = 4096;
  double request_timeout_s = 300;
  double shutdown_timeout_s = 30;
};

[[noreturn]] void core_fail_arg(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "anchorkv serve", msg);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class Server {
 public:
  Server(const ServeOptions& o, const model::LlamaWeights& w, const model::Tokenizer& tok, serve::ChatTemplate chat,
         std::string model_name)
      : o_(o), tok_(tok), chat_(chat), name_(std::move(model_name)), engine_(w, tok, o.engine), http_(o.http) {
    for (int32_t id = 0; id < tok_.size(); ++id)
      longest_piece_ = std::max<int64_t>(longest_piece_, static_cast<int64_t>(tok_.piece(id).size()));
    routes();
  }
  void start() { http_.start(o_.host, o_.port); }
  // A rolling restart: drains, persists, stops (see serve_main).
  void shut_down();

 private:
  void routes();
  HttpResponse completion(const HttpRequest& req, bool chat);
  HttpResponse stream(RequestFields f, serve::QueuePlace place, const std::string& id, bool chat);
  HttpResponse busy();
  HttpResponse drained();
  std::vector<int32_t> prompt_tokens(const json& body, bool chat, const model::Tokenizer::StopCheck& stop) const;
  std::vector<int32_t> token_ids(const json& p) const;
  void check_text_bytes(size_t bytes, const char* param) const;
  static json usage(const std::vector<serve::GenerateResult>& choices);
  std::string metrics_text() const;

  const ServeOptions& o_;
  const model::Tokenizer& tok_;
  const serve::ChatTemplate chat_;
  const std::string name_;
  serve::Engine engine_;
  HttpServer http_;
  int64_t longest_piece_ = 1;  // bytes of the longest token: a text of more than max_prompt times it is too long
  std::atomic<int64_t> next_id_{1}, http_errors_{0}, server_errors_{0};
  // Set when --shutdown-timeout has passed while draining: running
  // generations end at their next step (503, or an error event).
  std::atomic<bool> drain_expired_{false};
};

HttpResponse json_response(int status, const json& body) { return {status, "application/json", dump(body), {}, {}}; }

void Server::routes() {
  // Health answers from this thread alone: it never waits on the engine, a slot or the pool.
  // A store that is down degrades the service (every prompt is prefilled here), never fails it.
  http_.route("GET", "/health", [this](const HttpRequest&) {
    const bool draining = http_.draining();
    json body = {{"status", draining ? "draining" : "ok"}};
    if (const std::optional<bool> up = engine_.store_up()) body["kv_store"] = *up ? "up" : "down";
    return json_response(draining ? 503 : 200, body);
  });
  http_.route("GET", "/v1/models", [this](const HttpRequest&) {
    return json_response(200, {{"object", "list"},
                               {"data", json::array({{{"id", name_}, {"object", "model"}, {"created", 0},
                                                      {"owned_by", "anchorkv"}}})}});
  });
  http_.route("GET", "/metrics", [this](const HttpRequest&) {
    return HttpResponse{200, "text/plain; version=0.0.4", metrics_text(), {}, {}};
  });
  http_.route("POST", "/v1/completions", [this](const HttpRequest& r) { return completion(r, false); });
  http_.route("POST", "/v1/chat/completions", [this](const HttpRequest& r) { return completion(r, true); });
  http_.fallback([this](const HttpRequest&) {
    ++http_errors_;
    return json_response(404, error_body({404, "no such endpoint", ""}));
  });
  http_.on_exception([this](const std::string& what) {
    ++server_errors_;
    std::fprintf(stderr, "anchorkv serve: request failed: %s\n", what.c_str());
    return json_response(500, {{"error", {{"message", "internal error"}, {"type", "server_error"},
                                          {"param", nullptr}, {"code", nullptr}}}});
  });
}

// A text that cannot fit in max_prompt tokens is refused before it is tokenized.
void Server::check_text_bytes(size_t bytes, const char* param) const {
  if (static_cast<double>(bytes) > static_cast<double>(o_.max_prompt) * static_cast<double>(longest_piece_) + 8)
    throw ApiError{400, "the prompt is too long: the limit is " + std::to_string(o_.max_prompt) + " tokens", param};
}

std::vector<int32_t> Server::token_ids(const json& p) const {
  if (p.size() > static_cast<size_t>(o_.max_prompt))
    throw ApiError{400, "the prompt has " + std::to_string(p.size()) + " tokens; the limit is " +
                            std::to_string(o_.max_prompt), "prompt"};
  std::vector<int32_t> ids;
  for (const auto& x : p) {
    if (!x.is_number_integer()) throw ApiError{400, "'prompt' token ids must be integers", "prompt"};
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id >= tok_.size()) throw ApiError{400, "token id out of the vocabulary", "prompt"};
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Every message's role and content count against the prompt's byte limit
// before any is tokenized, and a conversation has at most --max-prompt
// messages (each costs the template at least one token).
std::vector<int32_t> Server::prompt_tokens(const json& body, bool chat, const model::Tokenizer::StopCheck& stop) const {
  std::vector<int32_t> ids;
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      throw ApiError{400, "'messages' must be a non-empty array", "messages"};
    const json& messages = body["messages"];
    if (messages.size() > static_cast<size_t>(o_.max_prompt))
      throw ApiError{400, "there are " + std::to_string(messages.size()) + " messages; the limit is " +
                              std::to_string(o_.max_prompt), "messages"};
    size_t bytes = 0;
    for (const auto& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        throw ApiError{400, "each message needs a string 'role' and 'content'", "messages"};
      bytes += m["role"].get_ref<const std::string&>().size() + m["content"].get_ref<const std::string&>().size();
    }
    if (chat_ == serve::ChatTemplate::kNone)
      throw ApiError{400, "the model has no known chat template; start the server with --chat-template", "messages"};
    check_text_bytes(bytes, "messages");
    std::vector<serve::ChatMessage> msgs;
    msgs.reserve(messages.size());
    for (const auto& m : messages) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    ids = serve::encode_chat(chat_, msgs, tok_, stop);
  } else {
    if (!body.contains("prompt")) throw ApiError{400, "'prompt' is required", "prompt"};
    const json& p = body["prompt"];
    if (p.is_string()) {
      check_text_bytes(p.get_ref<const std::string&>().size(), "prompt");
      ids = tok_.encode(p.get_ref<const std::string&>(), true, false, stop);
    } else if (p.is_array() && !p.empty()) {
      ids = token_ids(p);
    } else {
      throw ApiError{400, "'prompt' must be a string or a non-empty array of token ids", "prompt"};
    }
  }
  if (ids.empty()) throw ApiError{400, "the prompt is empty", chat ? "messages" : "prompt"};
  if (static_cast<int64_t>(ids.size()) > o_.max_prompt)
    throw ApiError{400, "the prompt has " + std::to_string(ids.size()) + " tokens; the limit is " +
                            std::to_string(o_.max_prompt),
                   chat ? "messages" : "prompt"};
  return ids;
}

// A token's text as OpenAI shows it: itself when it is valid UTF-8, else
// "bytes:\xNN..." (a byte token alone is half a character; two such tokens
// must not both become U+FFFD, one key of top_logprobs).
std::string shown_piece(const std::string& piece) {
  size_t i = 0;
  while (i < piece.size()) {
    const auto c = static_cast<unsigned char>(piece[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > piece.size()) break;
    size_t k = 1;
    while (k < n && (static_cast<unsigned char>(piece[i + k]) & 0xC0) == 0x80) ++k;
    if (k < n) break;
    i += n;
  }
  if (i == piece.size()) return piece;
  std::string out = "bytes:";
  for (unsigned char c : piece) out += fmt::format("\\x{:02x}", c);
  return out;
}

json piece_bytes(const std::string& piece) {
  json b = json::array();
  for (unsigned char c : piece) b.push_back(c);
  return b;
}

// OpenAI's two shapes: completions (tokens, token_logprobs, top_logprobs,
// text_offset) and chat (content: [{token, logprob, bytes, top_logprobs}]).
json logprobs_json(const serve::GenerateResult& r, bool chat) {
  if (chat) {
    json content = json::array();
    for (const auto& t : r.logprobs) {
      json top = json::array();
      for (const auto& [piece, lp] : t.top)
        top.push_back({{"token", shown_piece(piece)}, {"logprob", lp}, {"bytes", piece_bytes(piece)}});
      content.push_back({{"token", shown_piece(t.piece)}, {"logprob", t.logprob}, {"bytes", piece_bytes(t.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (const auto& t : r.logprobs) {
    tokens.push_back(shown_piece(t.piece));
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [piece, lp] : t.top) top[shown_piece(piece)] = lp;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// The prompt once (the choices after the first restore it whole), the
// completions of every choice.
json Server::usage(const std::vector<serve::GenerateResult>& choices) {
  int64_t completion = 0;
  for (const auto& r : choices) completion += r.completion_tokens;
  const serve::GenerateResult& first = choices.front();
  return {{"prompt_tokens", first.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", first.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", first.reused_tokens}}}};
}

// A choice: whole, or a stream's delta (a chat stream's first one names the role).
json choice_json(bool chat, int index, const std::string& text, const json& finish, bool delta,
                 bool opens = false) {
  json c = {{"index", index}, {"finish_reason", finish}};
  if (!chat) {
    c["text"] = text;
    c["logprobs"] = nullptr;
  } else if (delta) {
    c["delta"] = opens ? json{{"role", "assistant"}, {"content", text}}
                 : text.empty() ? json::object()
                                : json{{"content", text}};
  } else {
    c["message"] = {{"role", "assistant"}, {"content", text}};
    c["logprobs"] = nullptr;
  }
  return c;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Parses a body into at most `max_values` JSON values nested at most
// kMaxDepth deep: a megabyte of `[]` or `{}` would otherwise hold tens of
// bytes of objects for each byte received.
constexpr int kMaxDepth = 32;
json parse_bounded(const std::string& body, size_t max_values) {
  size_t values = 0;
  return json::parse(body, [&](int depth, json::parse_event_t event, json&) {
    if (depth > kMaxDepth)
      throw ApiError{400, "the body nests JSON deeper than " + std::to_string(kMaxDepth) + " levels", ""};
    if ((event == json::parse_event_t::value || event == json::parse_event_t::object_start ||
         event == json::parse_event_t::array_start) && ++values > max_values)
      throw ApiError{400, "the body holds more than " + std::to_string(max_values) + " JSON values", ""};
    return true;
  });
}

HttpResponse Server::completion(const HttpRequest& req, bool chat) {
  RequestFields f;
  // The deadline starts with the request: tokenizing counts against it, and
  // stops when it passes or the client leaves.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(o_.request_timeout_s));
  const model::Tokenizer::StopCheck stop = [&req, deadline] {
    return std::chrono::steady_clock::now() >= deadline || req.client_gone();
  };
  try {
    // Room for a prompt of token ids or of messages several times longer
    // than allowed, so that the checks below name what is too long.
    const json body = parse_bounded(req.body, 8 * static_cast<size_t>(std::max<int64_t>(o_.max_prompt, 8192)) + 256);
    if (!body.is_object()) throw ApiError{400, "the body must be a JSON object", ""};
    f = parse_request_fields(body, chat, {o_.max_tokens_limit, kMaxChoices, tok_.size()});
    f.gen.deadline = deadline;
    f.gen.prompt = prompt_tokens(body, chat, stop);
    if (chat) f.gen.stop.insert(f.gen.stop.end(), serve::chat_stops(chat_).begin(), serve::chat_stops(chat_).end());
  } catch (const json::exception& e) {
    ++http_errors_;
    return json_response(400, error_body({400, std::string("malformed JSON: ") + e.what(), ""}));
  } catch (const ApiError& e) {
    ++http_errors_;
    return json_response(e.status, error_body(e));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCancelled) throw;
    ++http_errors_;
    return json_response(408, error_body({408, "the prompt was not tokenized within --request-timeout", ""}));
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  serve::QueuePlace place;
  try {
    place = engine_.enter();  // before a stream's 200: a full queue is a 503 either way
  } catch (const serve::Busy&) {
    return busy();
  }
  if (f.stream) return stream(std::move(f), std::move(place), id, chat);
  f.gen.keep_going = [this, &req] { return !req.client_gone() && !drain_expired_; };
  std::vector<serve::GenerateResult> results;
  json choices = json::array();
  for (int i = 0; i < f.n; ++i) {  // choice i samples with seed + i; the later ones restore the prompt whole
    serve::GenerateRequest g = f.gen;
    g.sampler.seed += static_cast<uint64_t>(i);
    results.push_back(engine_.generate(g, i == 0 ? std::move(place) : engine_.enter_again()));
    const serve::GenerateResult& r = results.back();
    if (r.finish_reason == "cancelled" && drain_expired_) return drained();
    json c = choice_json(chat, i, r.text, r.finish_reason, false);
    if (f.gen.top_logprobs >= 0) c["logprobs"] = logprobs_json(r, chat);
    choices.push_back(std::move(c));
    if (r.finish_reason == "cancelled") break;  // the client left
  }
  return json_response(200, {{"id", id},
                             {"object", chat ? "chat.completion" : "text_completion"},
                             {"created", unix_now()},
                             {"model", name_},
                             {"choices", choices},
                             {"usage", usage(results)}});
}

HttpResponse Server::busy() {
  ++http_errors_;
  HttpResponse r = json_response(503, error_body({503, "the server is busy; retry shortly", ""}));
  r.headers.push_back({"Retry-After", "1"});
  return r;
}

HttpResponse Server::drained() {
  ++http_errors_;
  HttpResponse r =
      json_response(503, error_body({503, "the server shut down before the answer was complete; retry", ""}));
  r.headers.push_back({"Retry-After", "1"});
  r.headers.push_back({"Connection", "close"});
  return r;
}

// Server-sent events: for each choice in turn, a chunk per piece of text and
// a last one with its finish_reason; with stream_options.include_usage a
// chunk of the usage (no choices); then [DONE]. A stream the shutdown cut
// short ends with an error event instead.
HttpResponse Server::stream(RequestFields f, serve::QueuePlace place, const std::string& id, bool chat) {
  HttpResponse res{200, "text/event-stream", "", {{"Cache-Control", "no-cache"}}, {}};
  const int64_t created = unix_now();
  auto held = std::make_shared<serve::QueuePlace>(std::move(place));
  res.produce = [this, f = std::move(f), held, id, chat, created](const std::function<bool(const std::string&)>& write,
                                                                  const std::function<bool()>& gone) {
    auto send = [&](const json& j) { return write("data: " + dump(j) + "\n\n"); };
    auto chunk = [&](json choices) {
      json c = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", name_},
                {"choices", std::move(choices)}};
      if (f.include_usage) c["usage"] = nullptr;
      return c;
    };
    std::vector<serve::GenerateResult> results;
    for (int i = 0; i < f.n; ++i) {
      serve::GenerateRequest g = f.gen;
      g.sampler.seed += static_cast<uint64_t>(i);
      bool opened = false;
      g.on_text = [&](const std::string& text) {
        const bool opens = chat && !std::exchange(opened, true);
        return send(chunk(json::array({choice_json(chat, i, text, nullptr, true, opens)})));
      };
      g.keep_going = [&] { return !gone() && !http_.stopping() && !drain_expired_; };
      try {
        results.push_back(engine_.generate(g, i == 0 ? std::move(*held) : engine_.enter_again()));
      } catch (const std::exception& e) {
        ++server_errors_;
        std::fprintf(stderr, "anchorkv serve: a stream failed: %s\n", e.what());
        send(error_body({500, "internal error", ""}));
        return;
      }
      const serve::GenerateResult& r = results.back();
      if (r.finish_reason == "cancelled") {
        if (drain_expired_) send(error_body({503, "the server shut down before the answer was complete; retry", ""}));
        return;
      }
      send(chunk(json::array({choice_json(chat, i, "", r.finish_reason, true, chat && !opened)})));
    }
    if (f.include_usage) {
      json last = chunk(json::array());
      last["usage"] = usage(results);
      send(last);
    }
    write("data: [DONE]\n\n");
  };
  return res;
}

template <class Metric, class Count>
void store_metrics(const serve::StoreMetrics& s, Metric&& metric, Count&& count) {
  metric("kv_store_up", "gauge", "Whether the shared store answers (0: down, requests go on without it).", s.up);
  count("kv_store_lookups_total", "Lookups in the shared store.", s.lookups);
  count("kv_store_hits_total", "Lookups that found blocks in the shared store.", s.hits);
  count("kv_store_misses_total", "Lookups that found nothing (or a down store).", s.misses);
  count("kv_store_blocks_read_total", "Blocks read from the shared store.", s.blocks_read);
  count("kv_store_read_bytes_total", "Bytes of blocks read from the shared store.", s.bytes_read);
  count("kv_store_blocks_written_total", "Blocks written to the shared store.", s.blocks_written);
  count("kv_store_written_bytes_total", "Bytes of blocks written to the shared store.", s.bytes_written);
  count("kv_store_errors_total", "Round trips to the shared store that failed (each marks it down).", s.errors);
  count("kv_store_dropped_writes_total", "Blocks not written: the queue was full or the store down.",
        s.dropped_writes);
  count("kv_store_bad_entries_total", "Values in the shared store found damaged or foreign, and deleted.",
        s.bad_entries);
  metric("kv_store_lookup_seconds_total", "counter", "Time spent in lookups in the shared store.", s.lookup_seconds);
}

std::string Server::metrics_text() const {
  const serve::EngineMetrics m = engine_.metrics();
  const serve::PoolMetrics& pool = m.pool;
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP anchorkv_{} {}\n# TYPE anchorkv_{} {}\nanchorkv_{} {}\n", name, help, name, type,
                       name, v);
  };
  auto count = [&](const char* name, const char* help, int64_t v) {
    metric(name, "counter", help, static_cast<double>(v));
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    metric(name, "gauge", help, static_cast<double>(v));
  };
  count("requests_total", "Generation requests completed.", m.requests);
  count("request_errors_total", "Requests refused with a 4xx or 503 answer.", http_errors_ + http_.refused());
  count("server_errors_total", "Requests answered with a 500.", server_errors_);
  count("requests_cancelled_total", "Requests whose client went away.", m.cancelled);
  count("requests_timed_out_total", "Generations ended by --request-timeout.", m.timed_out);
  count("requests_busy_total", "Requests refused because --max-queue requests already waited.", m.busy);
  count("prompt_tokens_total", "Prompt tokens received.", m.prompt_tokens);
  count("prefilled_tokens_total", "Prompt tokens run through the model.", m.prefilled_tokens);
  count("completion_tokens_total", "Tokens generated.", m.completion_tokens);
  metric("prefill_seconds_total", "counter", "Time spent prefilling.", m.prefill_s);
  metric("decode_seconds_total", "counter", "Time spent decoding.", m.decode_s);
  count("prefix_hits_total", "Requests that reused a pooled prefix.", pool.hits);
  count("prefix_misses_total", "Requests with no pooled prefix.", pool.misses);
  gauge("prefix_pool_entries", "Prefix blocks held in memory.", pool.entries);
  gauge("prefix_pool_bytes", "Bytes the prefix pool holds (compressed caches).", pool.bytes);
  count("prefix_pool_evictions_total", "Prefix blocks evicted from memory for the byte budget.", pool.evictions);
  gauge("prefix_disk_entries", "Prefix blocks spilled to --cache-dir.", pool.disk_entries);
  gauge("prefix_disk_bytes", "Bytes of spilled prefix blocks.", pool.disk_bytes);
  count("prefix_disk_hits_total", "Prefix blocks read back from --cache-dir.", pool.disk_hits);
  count("prefix_disk_evictions_total", "Spilled prefix blocks removed for --cache-dir-budget.", pool.disk_evictions);
  count("prefix_bad_entries_total", "Pooled or spilled prefixes found damaged or foreign, and dropped.",
        pool.bad_entries);
  count("prefix_disk_errors_total", "Spills or removals in --cache-dir that failed.", pool.disk_errors);
  if (m.store) store_metrics(*m.store, metric, count);
  return out;
}

// A rolling restart. Requests that arrive from now on get 503 (health says
// "draining"); running ones finish until --shutdown-timeout, then end with a
// 503 or an error event; what is left of the deadline writes the pool's
// blocks to --cache-dir and the queue to --kv-store, most recently used first.
void Server::shut_down() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.shutdown_timeout_s));
  http_.drain({"/health", "/metrics"});
  if (!http_.wait_idle(deadline)) {
    drain_expired_ = true;
    std::fprintf(stderr, "anchorkv serve: --shutdown-timeout passed; ending the requests still running\n");
    http_.wait_idle(Clock::now() + std::chrono::seconds(10));  // each ends at its next step
  }
  const serve::Engine::Persisted p = engine_.persist(deadline);
  if (!o_.engine.cache_dir.empty() || p.pool.left > 0)
    std::fprintf(stderr, "anchorkv serve: %lld prefix blocks (%lld bytes) written to --cache-dir, %lld not written\n",
                 static_cast<long long>(p.pool.blocks), static_cast<long long>(p.pool.bytes),
                 static_cast<long long>(p.pool.left));
  if (!o_.engine.store.url.empty())
    std::fprintf(stderr, "anchorkv serve: %lld queued blocks written to --kv-store, %lld dropped\n",
                 static_cast<long long>(p.store_blocks), static_cast<long long>(p.store_dropped));
  http_.stop();
}

// "2GiB", "512MiB", "64M", "1000000" -> bytes, at most 2^50.
int64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string unit = s.substr(used);
  const double mult = unit.empty() || unit == "B" ? 1
                      : unit == "KiB" || unit == "K" ? 1024.0
                      : unit == "MiB" || unit == "M" ? 1024.0 * 1024
                      : unit == "GiB" || unit == "G" ? 1024.0 * 1024 * 1024
                                                     : -1;
  if (mult < 0 || !(v >= 0) || !(v * mult <= std::ldexp(1.0, 50))) throw std::invalid_argument("bad size");
  return static_cast<int64_t>(v * mult);
}

// Limits that depend on the model, and those the options cannot check alone.
void settle_limits(ServeOptions& o, const model::LlamaWeights& w) {
  const int64_t context = w.config.context > 0 ? w.config.context : 8192;
  if (o.max_prompt == 0) o.max_prompt = std::min<int64_t>(8192, context);
  if (o.max_prompt > context)
    core_fail_arg("--max-prompt " + std::to_string(o.max_prompt) + " exceeds the model's context of " +
                  std::to_string(context) + " tokens");
  try {
    o.engine.pool_budget = parse_bytes(o.cache_budget);
  } catch (const std::exception&) {
    core_fail_arg("--cache-budget must be a size up to 1PiB such as 2GiB, 512MiB or 1000000, got '" +
                  o.cache_budget + "'");
  }
  try {
    o.engine.cache_dir_budget = parse_bytes(o.cache_dir_budget);
  } catch (const std::exception&) {
    core_fail_arg("--cache-dir-budget must be a size up to 1PiB such as 20GiB, or 0 for no bound, got '" +
                  o.cache_dir_budget + "'");
  }
  if (!o.engine.store.url.empty()) {
    serve::parse_redis_url(o.engine.store.url);  // an unknown scheme or a malformed address stops here
    o.engine.store.timeout = std::chrono::milliseconds(o.kv_store_timeout_ms);
    // A password in the environment keeps it off the command line (and out of `ps`).
    if (const char* pw = std::getenv("ANCHORKV_KV_STORE_PASSWORD"); pw && *pw) o.engine.store.password = pw;
  }
  o.engine.slots = o.parallel;
  o.engine.threads = o.threads;
  o.http.max_connections = std::max<unsigned>(o.http.max_connections, static_cast<unsigned>(o.parallel) + 8);
}

void serve_main(ServeOptions o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  settle_limits(o, w);
  o.engine.model_identity = mf.identity;
  const model::Tokenizer& tok = mf.tok("anchorkv serve");
  const serve::ChatTemplate chat = serve::pick_chat_template(o.chat_template, mf.chat_template);
  // SIGINT / SIGTERM stop the server gracefully: blocked here (threads
  // inherit the mask), taken by the waiting main thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a store that closes its socket is an error on the write, not the end of the server
  Server server(o, w, tok, chat, std::filesystem::path(o.model).filename().string());
  server.start();
  std::fprintf(stderr, "anchorkv serve: %s on http://%s:%d (cache %s, theta %g, %d slot(s), pool %s, chat %s%s)\n",
               o.model.c_str(), o.host.c_str(), o.port, o.engine.cache.c_str(), o.engine.theta, o.parallel,
               o.cache_budget.c_str(), serve::chat_template_name(chat),
               o.engine.store.url.empty() ? ""
                                          : (", kv store " + serve::parse_redis_url(o.engine.store.url).redacted()).c_str());
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "anchorkv serve: signal %d, draining (up to %g s; a second signal exits at once)\n", sig,
               o.shutdown_timeout_s);
  std::thread([signals] {
    int again = 0;
    sigwait(&signals, &again);
    std::fprintf(stderr, "anchorkv serve: signal %d again, exiting now\n", again);
    std::_Exit(1);
  }).detach();
  server.shut_down();
  std::fprintf(stderr, "anchorkv serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with compressed prompt caches");
  sub->add_option("--model,-m", o->model, "GGUF model")->required();
  sub->add_option("--cache", o->engine.cache, cache_option_help("cache per layer"));
  sub->add_option("--theta", o->engine.theta, "cache byte budget")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--host", o->host, "address to listen on");
  sub->add_option("--port", o->port, "port")->check(CLI::Range(1, 65535));
  sub->add_option("--parallel", o->parallel, "requests generating at once")->check(CLI::Range(1, 64));
  sub->add_option("--threads", o->threads, "threads per request (0 = all cores)")->check(CLI::Range(0, 4096));
  sub->add_option("--cache-budget", o->cache_budget, "bytes of pooled prompt prefixes in memory, e.g. 2GiB");
  sub->add_option("--cache-dir", o->engine.cache_dir,
                  "spill prefixes evicted from memory here as cache files, and load them back on a hit");
  sub->add_option("--cache-dir-budget", o->cache_dir_budget,
                  "bytes of spilled prefixes --cache-dir keeps, the oldest removed first, e.g. 20GiB (0: no bound)");
  sub->add_option("--kv-store", o->engine.store.url,
                  "share prefix blocks with other replicas through a Redis-protocol store: "
                  "redis://[user:password@]host[:port][/db] or unix:///path[?db=N] (password also from "
                  "ANCHORKV_KV_STORE_PASSWORD)");
  sub->add_option("--kv-store-timeout", o->kv_store_timeout_ms, "milliseconds a store round trip may take")
      ->check(CLI::Range(1, 60000));
  sub->add_option("--kv-store-ttl", o->engine.store.ttl_s, "seconds a block stays in the store (0: until evicted)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  sub->add_option("--kv-store-queue", o->engine.store.queue, "blocks waiting to be written to the store; more are dropped")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  sub->add_option("--chat-template", o->chat_template,
                  "chatml, qwen3, llama3, mistral, gemma or phi3 (default: detected from the GGUF)");
  sub->add_option("--max-body", o->http.max_body, "largest request body, bytes (chunked or not)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  sub->add_option("--max-prompt", o->max_prompt, "largest prompt, tokens (default: the context, at most 8192)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--max-tokens-limit", o->max_tokens_limit, "largest max_tokens a request may ask for")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--max-queue", o->engine.max_queue, "requests waiting for a slot; more get 503")
      ->check(CLI::Range(0, 100000));
  sub->add_option("--request-timeout", o->request_timeout_s, "seconds a generation may take")
      ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--shutdown-timeout", o->shutdown_timeout_s,
                  "seconds SIGTERM waits for running requests and for writing pooled prefixes out")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--max-connections", o->http.max_connections, "open connections at once")
      ->check(CLI::Range(8u, 65536u));
  sub->add_option("--max-connections-per-ip", o->http.per_ip_connections, "open connections per client address (0: any)")
      ->check(CLI::Range(0u, 65536u));
  sub->add_option("--idle-timeout", o->http.idle_timeout_s, "seconds a silent connection stays open")
      ->check(CLI::Range(1u, 3600u));
  sub->add_option("--header-memory", o->http.header_memory, "bytes per connection for the request line and headers")
      ->check(CLI::Range(size_t{4096}, size_t{1} << 20));
  sub->callback([o] { serve_main(*o); });
}

}  // namespace anchorkv::cli
