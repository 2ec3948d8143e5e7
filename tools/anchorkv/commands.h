// Subcommands of the anchorkv command-line program.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cache/registry.h"
#include "model/matmul_kernels.h"
#include "model/llama.h"

namespace anchorkv::cli {
// One file per command (cmd_*.cc and the others named alike); `bench` is
// the `anchorkv bench` command the benchmarks add themselves to.
void register_demo(CLI::App& app);
void register_codec_mse(CLI::App& app);
void register_compare(CLI::App& app);
void register_logits(CLI::App& app);
void register_run(CLI::App& app);  // run and tokenize
void register_eval(CLI::App& app);
void register_analyze(CLI::App& app);
void register_dump_kv(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench(CLI::App* bench);  // attention, rope
void register_bench_runtime(CLI::App* bench);
void register_bench_persist(CLI::App* bench);

// Help for an option naming caches: every cache name and every modifier.
inline std::string cache_option_help(const std::string& lead) {
  std::string names;
  for (const auto& n : cache::cache_names()) names += (names.empty() ? "" : ", ") + n;
  return lead + ": " + names + ". " + cache::cache_modifier_help();
}

// --activations int8|f32 (what multiplies quantized weights, see model::Activations) and --no-amx.
inline void add_matmul_options(CLI::App* sub, model::Activations* a) {
  sub->add_option_function<std::string>(
         "--activations",
         [a](const std::string& v) {
           *a = v == "f32" ? model::Activations::kF32 : model::Activations::kInt8;
         },
         "matmuls on quantized weights: int8 (8-bit activations, integer dot products; decode, and prefill where the CPU has AMX tiles) or f32")
      ->check(CLI::IsMember({"int8", "f32"}))
      ->default_str("int8");
  sub->add_flag_callback(
      "--no-amx",
      [] {
        model::MatmulKernels k = model::matmul_kernels();
        k.amx = false;
        model::use_matmul_kernels(k);
      },
      "prefill without AMX tiles where the CPU has them (the row kernels, as on CPUs without AMX), for comparisons");
}

}  // namespace anchorkv::cli
