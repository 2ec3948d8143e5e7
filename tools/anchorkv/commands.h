// Subcommands of the anchorkv command-line program.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "model/llama.h"

namespace anchorkv::cli {
void register_demo(CLI::App& app);
void register_codec_mse(CLI::App& app);
void register_bench(CLI::App& app);
void register_compare(CLI::App& app);
void register_logits(CLI::App& app);
void register_runtime(CLI::App& app);

// A runtime cache choice "NAME[:pre]": any eval::make_cache name; ":pre" stores
// keys before RoPE (the paper's setting; not for caches that evict).
struct CacheSpec {
  std::string name;
  model::KeyRope keys = model::KeyRope::kPostRope;
};
CacheSpec parse_cache_spec(const std::string& spec);  // throws Error(kInvalidArgument)
model::LlamaModel make_model(const model::LlamaWeights& w, const std::string& spec, double theta,
                             int threads);
}  // namespace anchorkv::cli
