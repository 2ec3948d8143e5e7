#include "openai_request.h"

#include <algorithm>
#include <functional>
#include <vector>

namespace anchorkv::cli {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw ApiError{400, "'" + field + "' " + why, field};
}

const json* present(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

template <class T>
T field(const json& body, const char* name, T fallback, bool (json::*is)() const) {
  const json* v = present(body, name);
  if (!v) return fallback;
  if (!(v->*is)()) bad(name, "has the wrong type");
  return v->get<T>();
}

// Fields that change the answer and are accepted only at the value that
// changes nothing (OpenAI's default or an empty list).
struct NeutralOnly {
  const char* name;
  std::function<bool(const json&)> neutral;
  const char* expected;
};

const std::vector<NeutralOnly>& neutral_only() {
  static const std::vector<NeutralOnly> fields = {
      {"echo", [](const json& v) { return v == false; }, "false (the prompt is not echoed)"},
      {"suffix", [](const json& v) { return v == ""; }, "empty (no insertion)"},
      {"response_format", [](const json& v) { return v.is_object() && v.value("type", "") == "text"; },
       "{\"type\": \"text\"} (no structured output)"},
      {"tools", [](const json& v) { return v.is_array() && v.empty(); }, "empty (no tool calls)"},
      {"functions", [](const json& v) { return v.is_array() && v.empty(); }, "empty (no function calls)"},
      {"tool_choice", [](const json& v) { return v == "none" || v == "auto"; }, "\"none\" or \"auto\" without tools"},
      {"function_call", [](const json& v) { return v == "none" || v == "auto"; }, "\"none\" or \"auto\" without functions"},
      {"modalities", [](const json& v) { return v == json::array({"text"}); }, "[\"text\"]"},
      {"audio", [](const json&) { return false; }, "null (no audio output)"},
      {"reasoning_effort", [](const json&) { return false; }, "null (the model does not reason in a budget)"},
      {"verbosity", [](const json&) { return false; }, "null"},
      {"web_search_options", [](const json&) { return false; }, "null (no web search)"},
  };
  return fields;
}

// Fields that change nothing here, type-checked.
void check_inert(const json& body) {
  auto typed = [&](const char* name, bool (json::*is)() const, const char* type) {
    if (const json* v = present(body, name); v && !(v->*is)()) bad(name, std::string("must be ") + type);
  };
  typed("model", &json::is_string, "a string");
  typed("user", &json::is_string, "a string");
  typed("metadata", &json::is_object, "an object");
  typed("store", &json::is_boolean, "a boolean");
  typed("parallel_tool_calls", &json::is_boolean, "a boolean");
  typed("service_tier", &json::is_string, "a string");
  typed("prompt_cache_key", &json::is_string, "a string");
  typed("safety_identifier", &json::is_string, "a string");
}

int64_t max_tokens_of(const json& body, const RequestLimits& l) {
  int64_t n = field<int64_t>(body, "max_tokens", 16, &json::is_number_integer);
  if (const json* v = present(body, "max_completion_tokens")) {
    if (!v->is_number_integer()) bad("max_completion_tokens", "has the wrong type");
    const int64_t c = v->get<int64_t>();
    n = present(body, "max_tokens") ? std::min(n, c) : c;  // both: the smaller
    if (c < 0 || c > l.max_tokens_limit)
      bad("max_completion_tokens", "must be in [0, " + std::to_string(l.max_tokens_limit) + "]");
  }
  if (n < 0 || n > l.max_tokens_limit) bad("max_tokens", "must be in [0, " + std::to_string(l.max_tokens_limit) + "]");
  return n;
}

void parse_logprobs(const json& body, RequestFields& f) {
  // Completions: "logprobs": k (0..5). Chat: "logprobs": true, "top_logprobs": k (0..20).
  const json* lp = present(body, "logprobs");
  if (!lp) return;
  if (lp->is_boolean()) {
    const int64_t k = field<int64_t>(body, "top_logprobs", 0, &json::is_number_integer);
    if (k < 0 || k > 20) bad("top_logprobs", "must be in [0, 20]");
    f.gen.top_logprobs = lp->get<bool>() ? static_cast<int>(k) : -1;
  } else if (lp->is_number_integer() && lp->get<int64_t>() >= 0 && lp->get<int64_t>() <= 5) {
    f.gen.top_logprobs = static_cast<int>(lp->get<int64_t>());
  } else {
    bad("logprobs", "must be an integer in [0, 5] (completions) or a boolean (chat)");
  }
  if (f.stream && f.gen.top_logprobs >= 0) bad("logprobs", "is returned without streaming only");
}

void parse_stop(const json& body, RequestFields& f) {
  const json* st = present(body, "stop");
  if (!st) return;
  if (st->is_string()) {
    f.gen.stop.push_back(st->get<std::string>());
    return;
  }
  if (!st->is_array() || st->size() > 4) bad("stop", "must be a string or up to 4 strings");
  for (const auto& x : *st) {
    if (!x.is_string()) bad("stop", "must be a string or up to 4 strings");
    f.gen.stop.push_back(x.get<std::string>());
  }
}

// logit_bias {"token id": bias in [-100, 100]} and the two penalties in [-2, 2].
void parse_logit_changes(const json& body, const RequestLimits& l, RequestFields& f) {
  if (const json* b = present(body, "logit_bias")) {
    if (!b->is_object()) bad("logit_bias", "must be an object of token ids to biases");
    if (b->size() > 1024) bad("logit_bias", "has more than 1024 entries");
    for (const auto& [key, value] : b->items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0 || id >= l.vocab) bad("logit_bias", "names '" + key + "', which is no token id of this model");
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
        bad("logit_bias", "biases must be numbers in [-100, 100]");
      f.gen.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    }
  }
  f.gen.presence_penalty = field<float>(body, "presence_penalty", 0.0f, &json::is_number);
  f.gen.frequency_penalty = field<float>(body, "frequency_penalty", 0.0f, &json::is_number);
  if (!(f.gen.presence_penalty >= -2 && f.gen.presence_penalty <= 2)) bad("presence_penalty", "must be in [-2, 2]");
  if (!(f.gen.frequency_penalty >= -2 && f.gen.frequency_penalty <= 2)) bad("frequency_penalty", "must be in [-2, 2]");
}

}  // namespace

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.status == 404 ? "not_found_error" : e.status >= 500 ? "server_error" : "invalid_request_error"},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", nullptr}}}};
}

RequestFields parse_request_fields(const json& body, bool chat, const RequestLimits& l) {
  RequestFields f;
  for (const NeutralOnly& n : neutral_only())
    if (const json* v = present(body, n.name); v && !n.neutral(*v))
      bad(n.name, std::string("is not supported by this server except as ") + n.expected);
  check_inert(body);
  f.gen.max_tokens = max_tokens_of(body, l);
  f.gen.sampler.temperature = field<float>(body, "temperature", 1.0f, &json::is_number);
  f.gen.sampler.top_p = field<float>(body, "top_p", 1.0f, &json::is_number);
  f.gen.sampler.seed = field<uint64_t>(body, "seed", 1, &json::is_number_unsigned);
  if (!(f.gen.sampler.temperature >= 0 && f.gen.sampler.temperature <= 10)) bad("temperature", "must be in [0, 10]");
  if (!(f.gen.sampler.top_p > 0 && f.gen.sampler.top_p <= 1)) bad("top_p", "must be in (0, 1]");
  const int64_t n = field<int64_t>(body, "n", 1, &json::is_number_integer);
  if (n < 1 || n > l.max_choices) bad("n", "must be in [1, " + std::to_string(l.max_choices) + "]");
  f.n = static_cast<int>(n);
  if (!chat && field<int64_t>(body, "best_of", n, &json::is_number_integer) != n)
    bad("best_of", "is supported only equal to n (each choice is returned)");
  f.stream = field<bool>(body, "stream", false, &json::is_boolean);
  if (const json* so = present(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "must be an object");
    f.include_usage = field<bool>(*so, "include_usage", false, &json::is_boolean);
  }
  parse_logprobs(body, f);
  parse_stop(body, f);
  parse_logit_changes(body, l, f);
  return f;
}

}  // namespace anchorkv::cli
