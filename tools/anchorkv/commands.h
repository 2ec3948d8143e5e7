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
void register_bench_persist(CLI::App& app);  // after register_bench
void register_serve(CLI::App& app);

}  // namespace anchorkv::cli
