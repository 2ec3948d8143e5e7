// `anchorkv serve`: an OpenAI-compatible HTTP server (cpp-httplib, nlohmann
// JSON) over serve::Engine — completions and chat completions (plain and
// server-sent events), models, health and Prometheus metrics.
#include <httplib.h>
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
#include "eval/prompt_cache.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "serve/chat.h"
#include "serve/engine.h"

namespace anchorkv::cli {
namespace {

using json = nlohmann::json;

struct ServeOptions {
  std::string model, host = "127.0.0.1", chat_template, cache_budget = "1GiB";
  int port = 8080, parallel = 1, threads = 0;
  serve::EngineOptions engine;
  int64_t max_body = 1 << 20, max_prompt = 8192, max_tokens_limit = 4096;
};

// An OpenAI-style error; thrown by request parsing, answered with `status`.
struct ApiError {
  int status;
  std::string message, param;
};

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.status == 404 ? "not_found_error" : "invalid_request_error"},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", nullptr}}}};
}

[[noreturn]] void core_fail_arg(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "anchorkv serve", msg);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

template <class T>
T field(const json& body, const char* name, T fallback, bool (json::*is)() const) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!(body[name].*is)()) throw ApiError{400, std::string("'") + name + "' has the wrong type", name};
  return body[name].get<T>();
}

// What every generation request shares: sampling, limits, stop strings, stream.
struct Sampling {
  serve::GenerateRequest gen;
  bool stream = false;
};

Sampling parse_sampling(const json& body, const ServeOptions& o) {
  Sampling s;
  s.gen.max_tokens = field<int64_t>(body, "max_tokens", 16, &json::is_number_integer);
  if (s.gen.max_tokens < 0 || s.gen.max_tokens > o.max_tokens_limit)
    throw ApiError{400, "'max_tokens' must be in [0, " + std::to_string(o.max_tokens_limit) + "]", "max_tokens"};
  s.gen.sampler.temperature = field<float>(body, "temperature", 1.0f, &json::is_number);
  s.gen.sampler.top_p = field<float>(body, "top_p", 1.0f, &json::is_number);
  s.gen.sampler.seed = field<uint64_t>(body, "seed", 1, &json::is_number_unsigned);
  if (!(s.gen.sampler.temperature >= 0 && s.gen.sampler.temperature <= 10))
    throw ApiError{400, "'temperature' must be in [0, 10]", "temperature"};
  if (!(s.gen.sampler.top_p > 0 && s.gen.sampler.top_p <= 1)) throw ApiError{400, "'top_p' must be in (0, 1]", "top_p"};
  s.stream = field<bool>(body, "stream", false, &json::is_boolean);
  // Completions: "logprobs": k (0..5). Chat: "logprobs": true, "top_logprobs": k (0..20).
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const json& lp = body["logprobs"];
    if (lp.is_boolean()) {
      const int64_t k = field<int64_t>(body, "top_logprobs", 0, &json::is_number_integer);
      if (k < 0 || k > 20) throw ApiError{400, "'top_logprobs' must be in [0, 20]", "top_logprobs"};
      s.gen.top_logprobs = lp.get<bool>() ? static_cast<int>(k) : -1;
    } else if (lp.is_number_integer() && lp.get<int64_t>() >= 0 && lp.get<int64_t>() <= 5) {
      s.gen.top_logprobs = static_cast<int>(lp.get<int64_t>());
    } else {
      throw ApiError{400, "'logprobs' must be an integer in [0, 5] (completions) or a boolean (chat)", "logprobs"};
    }
    if (s.stream && s.gen.top_logprobs >= 0)
      throw ApiError{400, "logprobs are returned without streaming only", "logprobs"};
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& st = body["stop"];
    if (st.is_string()) {
      s.gen.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 4) {
      for (const auto& x : st) {
        if (!x.is_string()) throw ApiError{400, "'stop' must be a string or up to 4 strings", "stop"};
        s.gen.stop.push_back(x.get<std::string>());
      }
    } else {
      throw ApiError{400, "'stop' must be a string or up to 4 strings", "stop"};
    }
  }
  return s;
}

class Server {
 public:
  Server(const ServeOptions& o, const model::LlamaWeights& w, const model::Tokenizer& tok, serve::ChatTemplate chat,
         std::string model_name)
      : o_(o), tok_(tok), chat_(chat), name_(std::move(model_name)), engine_(w, tok, o.engine) {
    routes();
  }
  bool listen() { return http_.listen(o_.host.c_str(), o_.port); }
  void stop() { http_.stop(); }

 private:
  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::vector<int32_t> prompt_tokens(const json& body, bool chat) const;
  json usage(const serve::GenerateResult& r) const;
  std::string metrics_text() const;

  const ServeOptions& o_;
  const model::Tokenizer& tok_;
  const serve::ChatTemplate chat_;
  const std::string name_;
  serve::Engine engine_;
  httplib::Server http_;
  std::atomic<int64_t> next_id_{1}, http_errors_{0};
};

void Server::routes() {
  http_.set_payload_max_length(static_cast<size_t>(o_.max_body));
  const int workers = std::max(4, o_.parallel + 4);  // health and metrics answer while slots are busy
  http_.new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"object", "list"},
                          {"data", json::array({{{"id", name_}, {"object", "model"}, {"created", 0},
                                                 {"owned_by", "anchorkv"}}})}}),
                    "application/json");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
  http_.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
  http_.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    ++http_errors_;
    const int status = res.status;
    res.set_content(dump(error_body({status, status == 404 ? "no such endpoint" : "request refused", ""})),
                    "application/json");
  });
}

std::vector<int32_t> Server::prompt_tokens(const json& body, bool chat) const {
  std::vector<int32_t> ids;
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      throw ApiError{400, "'messages' must be a non-empty array", "messages"};
    std::vector<serve::ChatMessage> msgs;
    for (const auto& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        throw ApiError{400, "each message needs a string 'role' and 'content'", "messages"};
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    if (chat_ == serve::ChatTemplate::kNone)
      throw ApiError{400, "the model has no known chat template; start the server with --chat-template", "messages"};
    ids = tok_.encode(serve::render_chat(chat_, msgs), serve::chat_adds_bos(chat_));
  } else {
    if (!body.contains("prompt")) throw ApiError{400, "'prompt' is required", "prompt"};
    const json& p = body["prompt"];
    if (p.is_string()) {
      ids = tok_.encode(p.get<std::string>(), true);
    } else if (p.is_array() && !p.empty() && p.size() <= static_cast<size_t>(o_.max_prompt) &&
               std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
      for (const auto& x : p) {
        const int64_t id = x.get<int64_t>();
        if (id < 0 || id >= tok_.size()) throw ApiError{400, "token id out of the vocabulary", "prompt"};
        ids.push_back(static_cast<int32_t>(id));
      }
    } else {
      throw ApiError{400, "'prompt' must be a string or an array of token ids", "prompt"};
    }
  }
  if (ids.empty()) throw ApiError{400, "the prompt is empty", chat ? "messages" : "prompt"};
  if (static_cast<int64_t>(ids.size()) > o_.max_prompt)
    throw ApiError{400, "the prompt has " + std::to_string(ids.size()) + " tokens; the limit is " +
                            std::to_string(o_.max_prompt),
                   chat ? "messages" : "prompt"};
  return ids;
}

// OpenAI's two shapes: completions (tokens, token_logprobs, top_logprobs,
// text_offset) and chat (content: [{token, logprob, top_logprobs}]).
json logprobs_json(const serve::GenerateResult& r, bool chat) {
  if (chat) {
    json content = json::array();
    for (const auto& t : r.logprobs) {
      json top = json::array();
      for (const auto& [piece, lp] : t.top) top.push_back({{"token", piece}, {"logprob", lp}});
      content.push_back({{"token", t.piece}, {"logprob", t.logprob}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (const auto& t : r.logprobs) {
    tokens.push_back(t.piece);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [piece, lp] : t.top) top[piece] = lp;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Server::usage(const serve::GenerateResult& r) const {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.reused_tokens}}}};
}

void Server::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  Sampling s;
  try {
    const json body = json::parse(req.body);
    if (!body.is_object()) throw ApiError{400, "the body must be a JSON object", ""};
    s = parse_sampling(body, o_);
    s.gen.prompt = prompt_tokens(body, chat);
    if (chat) s.gen.stop.insert(s.gen.stop.end(), serve::chat_stops(chat_).begin(), serve::chat_stops(chat_).end());
  } catch (const json::exception& e) {
    ++http_errors_;
    res.status = 400;
    res.set_content(dump(error_body({400, std::string("malformed JSON: ") + e.what(), ""})), "application/json");
    return;
  } catch (const ApiError& e) {
    ++http_errors_;
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
    return;
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  const std::string object = chat ? "chat.completion" : "text_completion";
  auto choice = [chat](const std::string& text, const json& finish, bool delta) {
    json c = {{"index", 0}, {"finish_reason", finish}};
    if (!chat) {
      c["text"] = text;
      c["logprobs"] = nullptr;
    } else if (delta) {
      c["delta"] = text.empty() ? json::object() : json{{"content", text}};
    } else {
      c["message"] = {{"role", "assistant"}, {"content", text}};
    }
    return c;
  };
  if (!s.stream) {
    const serve::GenerateResult r = engine_.generate(s.gen);
    json c = choice(r.text, r.finish_reason, false);
    if (s.gen.top_logprobs >= 0) c["logprobs"] = logprobs_json(r, chat);
    res.set_content(dump({{"id", id},
                          {"object", object},
                          {"created", created},
                          {"model", name_},
                          {"choices", json::array({c})},
                          {"usage", usage(r)}}),
                    "application/json");
    return;
  }
  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      const std::string line = "data: " + dump(j) + "\n\n";
      return sink.is_writable() && sink.write(line.data(), line.size());
    };
    auto chunk = [&](const std::string& text, const json& finish) {
      return json{{"id", id},
                  {"object", chunk_object},
                  {"created", created},
                  {"model", name_},
                  {"choices", json::array({choice(text, finish, true)})}};
    };
    serve::GenerateRequest gen = s.gen;
    gen.on_text = [&](const std::string& text) { return send(chunk(text, nullptr)); };
    const serve::GenerateResult r = engine_.generate(gen);
    if (r.finish_reason != "cancelled") {
      json last = chunk("", r.finish_reason);
      last["usage"] = usage(r);
      send(last);
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
    }
    sink.done();
    return true;
  });
}

std::string Server::metrics_text() const {
  const serve::EngineMetrics m = engine_.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP anchorkv_{} {}\n# TYPE anchorkv_{} {}\nanchorkv_{} {}\n", name, help, name, type,
                       name, v);
  };
  metric("requests_total", "counter", "Generation requests completed.", static_cast<double>(m.requests));
  metric("request_errors_total", "counter", "Requests refused with a 4xx answer.", static_cast<double>(http_errors_));
  metric("prompt_tokens_total", "counter", "Prompt tokens received.", static_cast<double>(m.prompt_tokens));
  metric("prefilled_tokens_total", "counter", "Prompt tokens run through the model.",
         static_cast<double>(m.prefilled_tokens));
  metric("completion_tokens_total", "counter", "Tokens generated.", static_cast<double>(m.completion_tokens));
  metric("prefill_seconds_total", "counter", "Time spent prefilling.", m.prefill_s);
  metric("decode_seconds_total", "counter", "Time spent decoding.", m.decode_s);
  metric("prefix_hits_total", "counter", "Requests that reused a pooled prefix.", static_cast<double>(m.prefix_hits));
  metric("prefix_misses_total", "counter", "Requests with no pooled prefix.", static_cast<double>(m.prefix_misses));
  metric("prefix_pool_entries", "gauge", "Prompt prefixes held.", static_cast<double>(m.pool_entries));
  metric("prefix_pool_bytes", "gauge", "Bytes the prefix pool holds (compressed caches).",
         static_cast<double>(m.pool_bytes));
  metric("prefix_pool_evictions_total", "counter", "Prefixes evicted from memory for the byte budget.",
         static_cast<double>(m.pool_evictions));
  metric("prefix_disk_entries", "gauge", "Prefixes spilled to --cache-dir.", static_cast<double>(m.disk_entries));
  metric("prefix_disk_bytes", "gauge", "Bytes of spilled prefixes.", static_cast<double>(m.disk_bytes));
  metric("prefix_disk_hits_total", "counter", "Prefixes loaded back from --cache-dir.",
         static_cast<double>(m.disk_hits));
  return out;
}

// "2GiB", "512MiB", "64M", "1000000" -> bytes.
int64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string unit = s.substr(used);
  const double mult = unit.empty() || unit == "B" ? 1
                      : unit == "KiB" || unit == "K" ? 1024.0
                      : unit == "MiB" || unit == "M" ? 1024.0 * 1024
                      : unit == "GiB" || unit == "G" ? 1024.0 * 1024 * 1024
                                                     : -1;
  if (mult < 0 || !(v >= 0)) throw std::invalid_argument("bad size");
  return static_cast<int64_t>(v * mult);
}

void serve_main(ServeOptions o) {
  try {
    o.engine.pool_budget = parse_bytes(o.cache_budget);
  } catch (const std::exception&) {
    core_fail_arg("--cache-budget must be a size such as 2GiB, 512MiB or 1000000, got '" + o.cache_budget + "'");
  }
  o.engine.slots = o.parallel;
  o.engine.threads = o.threads;
  const model::LlamaWeights w = model::load_model(o.model);
  o.engine.model_identity = eval::model_identity(o.model, w);
  const io::GgufFile f = io::GgufFile::open(o.model);
  const model::Tokenizer tok = model::Tokenizer::from_gguf(f);
  const serve::ChatTemplate chat = serve::pick_chat_template(
      o.chat_template, f.has("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : "");
  // SIGINT / SIGTERM stop the server gracefully: blocked here (threads
  // inherit the mask), taken by one waiting thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Server server(o, w, tok, chat, std::filesystem::path(o.model).filename().string());
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "anchorkv serve: signal %d, stopping\n", sig);
    server.stop();
  });
  std::fprintf(stderr, "anchorkv serve: %s on http://%s:%d (cache %s, theta %g, %d slot(s), pool %s, chat %s)\n",
               o.model.c_str(), o.host.c_str(), o.port, o.engine.cache.c_str(), o.engine.theta, o.parallel,
               o.cache_budget.c_str(), serve::chat_template_name(chat));
  const bool ok = server.listen();
  if (!ok) {
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    core_fail_arg("cannot listen on " + o.host + ":" + std::to_string(o.port));
  }
  waiter.join();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with compressed prompt caches");
  sub->add_option("--model,-m", o->model, "GGUF model")->required();
  sub->add_option("--cache", o->engine.cache, cache_option_help("cache per layer"));
  sub->add_option("--theta", o->engine.theta, "cache byte budget");
  sub->add_option("--host", o->host, "address to listen on");
  sub->add_option("--port", o->port, "port")->check(CLI::Range(1, 65535));
  sub->add_option("--parallel", o->parallel, "requests generating at once")->check(CLI::Range(1, 64));
  sub->add_option("--threads", o->threads, "threads per request (0 = all cores)");
  sub->add_option("--cache-budget", o->cache_budget, "bytes of pooled prompt prefixes in memory, e.g. 2GiB");
  sub->add_option("--cache-dir", o->engine.cache_dir,
                  "spill prefixes evicted from memory here as cache files, and load them back on a hit");
  sub->add_option("--chat-template", o->chat_template, "chatml, llama3 or mistral (default: detected from the GGUF)");
  sub->add_option("--max-body", o->max_body, "largest request body, bytes");
  sub->add_option("--max-prompt", o->max_prompt, "largest prompt, tokens");
  sub->add_option("--max-tokens-limit", o->max_tokens_limit, "largest max_tokens a request may ask for");
  sub->callback([o] { serve_main(*o); });
}

}  // namespace anchorkv::cli
