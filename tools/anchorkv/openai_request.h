// The fields of OpenAI's completions and chat completions requests, and what
// `anchorkv serve` does with each (docs/serve.md, "Request fields"): a field
// that changes the answer is honoured, or accepted only at the value that
// changes nothing, or refused with a 400 naming it; a field that changes
// nothing (user, metadata, store, ...) is accepted; an unknown field is
// ignored, as OpenAI clients send fields a server may not know.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/engine.h"

namespace anchorkv::cli {

// An OpenAI-style error; thrown by request parsing, answered with `status`.
struct ApiError {
  int status;
  std::string message, param;
};

nlohmann::json error_body(const ApiError& e);

struct RequestLimits {
  int64_t max_tokens_limit = 4096;  // max_tokens / max_completion_tokens
  int max_choices = 16;             // n
  int64_t vocab = 0;                // token ids of logit_bias
};

// What a request asks of a generation, the prompt aside.
struct RequestFields {
  serve::GenerateRequest gen;  // sampling, max_tokens, stop strings, logprobs, logit bias, penalties
  int n = 1;                   // choices: choice i samples with seed + i
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// Throws ApiError naming the field for a wrong type, a value out of range, or
// a value this server cannot honour.
RequestFields parse_request_fields(const nlohmann::json& body, bool chat, const RequestLimits& limits);

}  // namespace anchorkv::cli
