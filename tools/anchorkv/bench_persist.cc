// `anchorkv bench persist`: cache files per cache kind — bytes on disk, save
// and load time — on a synthetic Llama-3-8B-shaped layer, and with a real
// model the time to the first token from a loaded prompt cache vs a prefill.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/rng.h"
#include "runtime/prompt_cache.h"
#include "eval/tasks.h"
#include "eval/workload.h"

namespace anchorkv::cli {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct PersistOptions {
  std::vector<std::string> caches = {"full", "anchorkv", "anchorkv_compact", "quantized4", "kivi2", "snapkv"};
  int64_t seq = 32768;
  double theta = 0.05;
  int reps = 5;
  std::string model, dir, json_path;
  int64_t ctx = 1024;
};

// One synthetic layer per cache kind: save and load medians, bytes on disk.
nlohmann::json layer_rows(const PersistOptions& o, const std::string& dir) {
  eval::SyntheticSpec spec;
  spec.S = o.seq;
  const eval::Workload w = eval::make_synthetic(spec);
  fmt::print("one layer, B = 1, H = 8, D = 128, S = {}, theta {}, median of {}\n\n", o.seq, o.theta, o.reps);
  fmt::print("  {:<18} {:>12} {:>10} {:>10} {:>10}\n", "cache", "file bytes", "vs full", "save ms", "load ms");
  nlohmann::json rows = nlohmann::json::array();
  double full_bytes = 0;
  for (const std::string& name : o.caches) {
    auto cache = cache::make_cache(name, o.theta, 0);
    cache->update(w.keys(), w.values());
    const std::string path = dir + "/layer_" + name + ".akvc";
    std::vector<double> save_ms, load_ms;
    for (int r = 0; r < o.reps; ++r) {
      auto t0 = Clock::now();
      save_caches(path, {cache.get()});
      save_ms.push_back(ms_since(t0));
      t0 = Clock::now();
      const LoadedCaches l = load_caches(path);
      load_ms.push_back(ms_since(t0));
    }
    const auto bytes = static_cast<double>(std::filesystem::file_size(path));
    if (name == "full") full_bytes = bytes;
    fmt::print("  {:<18} {:>12.0f} {:>10} {:>10.2f} {:>10.2f}\n", name, bytes,
               full_bytes > 0 ? fmt::format("{:.3f}", bytes / full_bytes) : "-", median(save_ms), median(load_ms));
    rows.push_back({{"cache", name}, {"file_bytes", bytes}, {"save_ms", median(save_ms)}, {"load_ms", median(load_ms)}});
    std::filesystem::remove(path);
  }
  return rows;
}

// A real model: prefill of --ctx tokens vs restoring them from a prompt cache
// (time to the first token's logits), and the file per cache.
nlohmann::json model_rows(const PersistOptions& o, const std::string& dir) {
  const model::LlamaWeights w = model::load_model(o.model);
  const std::string identity = runtime::model_identity(o.model, w);
  core::Rng rng(7);
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < o.ctx; ++i) prompt.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(w.config.vocab)));
  fmt::print("\n{}: {} prompt tokens, theta {}, median of {}\n\n", o.model, o.ctx, o.theta, o.reps);
  fmt::print("  {:<22} {:>12} {:>10} {:>12} {:>14} {:>10}\n", "cache", "file bytes", "save ms", "prefill ms",
             "from file ms", "speedup");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& spec : o.caches) {
    const std::string path = dir + "/prompt.akvc";
    std::vector<double> prefill_ms, restore_ms, save_ms;
    for (int r = 0; r < o.reps; ++r) {
      model::LlamaModel m = runtime::make_model(w, spec, o.theta, 0);
      auto t0 = Clock::now();
      const std::vector<float> logits = m.forward(prompt);
      prefill_ms.push_back(ms_since(t0));
      t0 = Clock::now();
      runtime::save_prompt(path, identity, spec, o.theta, prompt, logits, m);
      save_ms.push_back(ms_since(t0));
      model::LlamaModel fresh = runtime::make_model(w, spec, o.theta, 0);
      t0 = Clock::now();
      const runtime::PromptCacheHit hit = runtime::try_restore(path, identity, spec, o.theta, prompt, fresh);
      restore_ms.push_back(ms_since(t0));
      if (!hit.used || hit.logits != logits) throw std::runtime_error("prompt cache did not restore the prefill");
    }
    const auto bytes = static_cast<double>(std::filesystem::file_size(path));
    fmt::print("  {:<22} {:>12.0f} {:>10.2f} {:>12.2f} {:>14.2f} {:>9.1f}x\n", spec, bytes, median(save_ms),
               median(prefill_ms), median(restore_ms), median(prefill_ms) / median(restore_ms));
    rows.push_back({{"cache", spec}, {"file_bytes", bytes}, {"save_ms", median(save_ms)},
                    {"prefill_ms", median(prefill_ms)}, {"restore_ms", median(restore_ms)}});
    std::filesystem::remove(path);
  }
  return rows;
}

void bench_persist(const PersistOptions& o) {
  const std::string dir = o.dir.empty() ? std::filesystem::temp_directory_path().string() : o.dir;
  nlohmann::json out{{"layer", layer_rows(o, dir)}};
  if (!o.model.empty()) out["model"] = model_rows(o, dir);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2);
}

}  // namespace

void register_bench_persist(CLI::App* bench) {
  auto o = std::make_shared<PersistOptions>();
  CLI::App* sub = bench->add_subcommand("persist", "Cache files: bytes on disk, save / load time");
  sub->add_option("--caches", o->caches, "caches")->delimiter(',');
  sub->add_option("--seq", o->seq, "tokens of the synthetic layer")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  sub->add_option("--theta", o->theta, "byte budget of the budgeted caches");
  sub->add_option("--reps", o->reps, "repetitions (median)")->check(CLI::Range(1, 100));
  sub->add_option("--model,-m", o->model, "also measure a model's prompt caches (GGUF / llama2.c)");
  sub->add_option("--ctx", o->ctx, "prompt tokens for --model")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  sub->add_option("--dir", o->dir, "folder for the files (default: the temporary folder)");
  sub->add_option("--json", o->json_path, "write JSON here");
  sub->callback([o] { bench_persist(*o); });
}

}  // namespace anchorkv::cli
