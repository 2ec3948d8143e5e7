// `anchorkv bench runtime`: prefill and decode speed of a real model with each cache, side by side.
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/error.h"
#include "inputs.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "runtime/model_file.h"
#include "runtime/session.h"

namespace anchorkv::cli {
namespace {

// ---------------------------------------------------------------- bench runtime

struct RuntimeBenchOptions {
  std::string model, text;
  int64_t ctx = 1024, n = 128;
  std::vector<std::string> caches = {"full",   "anchorkv_tight:pre:obs:auto", "anchorkv", "anchorkv_compact",
                                     "anchorkv:pre", "snapkv", "streamingllm", "kivi2"};
  double theta = 0.1;
  int reps = 3, threads = 0;
  int64_t prefill_chunk = runtime::kPrefillChunk;
  std::string json_path;
  model::Activations activations = model::Activations::kInt8;
};

// Prefill and greedy-decode speed with each cache, caches interleaved within
// each repetition (same machine state), medians over repetitions.
struct Sample {
  std::vector<double> prefill, decode, first_ms;  // first_ms: the first decode step after the prompt
  // Per repetition: percentiles of the decode steps' times, and the rate of the last 64.
  std::vector<double> p50_ms, p99_ms, max_ms, last_decode;
  // Per repetition: the slowest step that closed a segment (closing_step_times), -1 for none.
  std::vector<double> close_max_ms, close_p50_ms;
  int64_t close_steps = 0;
  std::vector<double> prefill_peak;  // bytes the process's resident set grew by at most during the prefill
  int64_t cache_peak = 0;            // the caches' bytes at their largest between the prefill's calls
  double ratio = 1, ratio_end = 1;
  int64_t bytes = 0, full = 0, bytes_end = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The least of v: of the prefill peaks, a repetition's after the first
// (which also faults in the weights and every one-time buffer).
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// The q-quantile (0..1) of v, nearest rank.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

void add_steps(Sample& s, const std::vector<double>& step_s) {
  s.p50_ms.push_back(1e3 * quantile(step_s, 0.5));
  s.p99_ms.push_back(1e3 * quantile(step_s, 0.99));
  s.max_ms.push_back(1e3 * quantile(step_s, 1.0));
  const size_t last = std::min<size_t>(64, step_s.size());
  double t = 0;
  for (size_t i = step_s.size() - last; i < step_s.size(); ++i) t += step_s[i];
  s.last_decode.push_back(static_cast<double>(last) / std::max(t, 1e-9));
}

// The times of the steps that close a segment: those that hand one to the
// background (layers compressing off the path go from none to some) and
// those that commit one (their change in stored bytes is not the one most
// steps share: every other step adds one exact token). None for caches
// whose every step adds the same, or when no change is shared by more than
// half of the steps.
std::vector<double> closing_step_times(const std::vector<double>& step_s, const runtime::CacheTotals& before,
                                       const std::vector<runtime::CacheTotals>& after) {
  std::map<int64_t, int64_t> count;
  std::vector<int64_t> delta(after.size());
  for (size_t i = 0; i < after.size(); ++i) {
    delta[i] = after[i].bytes - (i == 0 ? before.bytes : after[i - 1].bytes);
    ++count[delta[i]];
  }
  const auto modal = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) { return a.second < b.second; });
  std::vector<double> out;
  if (2 * modal->second <= static_cast<int64_t>(delta.size())) return out;
  for (size_t i = 0; i < delta.size(); ++i) {
    const int64_t compressing_before = i == 0 ? before.compressing : after[i - 1].compressing;
    if (delta[i] != modal->first || (compressing_before == 0 && after[i].compressing > 0)) out.push_back(step_s[i]);
  }
  return out;
}

// Linux: a /proc/self/status field in bytes (-1 when unreadable).
int64_t status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string want = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(want, 0) == 0) return 1024 * std::stoll(line.substr(want.size()));
  return -1;
}

// The resident set now, after freed heap pages went back to the kernel and
// the high-water mark was reset to it: what a step allocates afresh (or
// reuses from what was freed) counts in the next VmHWM.
int64_t start_peak_window() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_bytes("VmRSS");
}

// The prompt: --text's tokens, padded (or made) to --ctx with seeded random ids.
std::vector<int32_t> bench_prompt(const RuntimeBenchOptions& o, const runtime::ModelFile& mf) {
  std::vector<int32_t> prompt;
  if (!o.text.empty()) prompt = mf.tok("anchorkv bench runtime").encode(read_file(o.text), true);
  core::Rng rng(7);
  while (static_cast<int64_t>(prompt.size()) < o.ctx)
    prompt.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(mf.weights.config.vocab)));
  prompt.resize(static_cast<size_t>(o.ctx));
  return prompt;
}

// One repetition of one cache: prefill, then o.n greedy steps.
void measure(const RuntimeBenchOptions& o, const model::LlamaWeights& w, const std::string& cache,
             const std::vector<int32_t>& prompt, Sample& s) {
  model::LlamaModel m = runtime::make_model(w, cache, o.theta, o.threads);
  m.set_activations(o.activations);
  const int64_t rss0 = start_peak_window();
  auto t0 = Clock::now();
  int64_t cache_peak = 0;
  std::vector<float> logits = runtime::prefill_prompt(m, prompt, o.prefill_chunk, [&] {
    cache_peak = std::max(cache_peak, runtime::cache_totals(m).bytes);
  });
  s.cache_peak = std::max(cache_peak, runtime::cache_totals(m).bytes);
  const double pre_s = since(t0);
  const int64_t hwm = status_bytes("VmHWM");
  if (rss0 >= 0 && hwm >= rss0) s.prefill_peak.push_back(static_cast<double>(hwm - rss0));
  const runtime::CacheTotals t = runtime::cache_totals(m);
  std::vector<double> step_s;
  std::vector<runtime::CacheTotals> after;
  step_s.reserve(static_cast<size_t>(o.n));
  after.reserve(static_cast<size_t>(o.n));
  for (int64_t i = 0; i < o.n; ++i) {
    const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const auto ts = Clock::now();
    logits = m.forward({next});
    step_s.push_back(since(ts));
    after.push_back(runtime::cache_totals(m));
  }
  const std::vector<double> closing = step_s.empty() ? std::vector<double>{} : closing_step_times(step_s, t, after);
  s.close_max_ms.push_back(closing.empty() ? -1.0 : 1e3 * *std::max_element(closing.begin(), closing.end()));
  s.close_p50_ms.push_back(closing.empty() ? -1.0 : 1e3 * median(closing));
  s.close_steps = static_cast<int64_t>(closing.size());
  double dec_s = 0;
  for (double x : step_s) dec_s += x;
  s.first_ms.push_back(1e3 * step_s.front());
  add_steps(s, step_s);
  const runtime::CacheTotals end = runtime::cache_totals(m);
  s.bytes_end = end.bytes;
  s.ratio_end = end.ratio();
  s.prefill.push_back(static_cast<double>(o.ctx) / pre_s);
  s.decode.push_back(static_cast<double>(o.n) / std::max(dec_s, 1e-9));
  s.bytes = t.bytes;
  s.full = t.full;
  s.ratio = t.ratio();
}

// The table, and the JSON rows, against the full cache where it ran.
nlohmann::json report(const RuntimeBenchOptions& o, std::map<std::string, Sample>& samples) {
  size_t width = 21;  // the longest spec sets the first column
  for (const auto& c : o.caches) width = std::max(width, c.size());
  fmt::print("  {:<{}} {:>9} {:>9} {:>13} {:>9} {:>12} {:>9} {:>13} {:>8} {:>8} {:>8} {:>13} {:>9} {:>11} {:>16} "
             "{:>11}\n",
             "cache", width, "KV MiB", "ratio", "prefill t/s", "vs full", "decode t/s", "vs full", "1st step ms",
             "p50 ms", "p99 ms", "max ms", "close max ms", "at end", "last 64 t/s", "prefill peak MiB", "KV peak MiB");
  const double full_pre = samples.count("full") ? median(samples["full"].prefill) : 0;
  const double full_dec = samples.count("full") ? median(samples["full"].decode) : 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : o.caches) {
    const Sample& s = samples[c];
    const double p = median(s.prefill), d = median(s.decode), first = median(s.first_ms);
    const bool peak = !s.prefill_peak.empty();
    const double close = median(s.close_max_ms);
    fmt::print("  {:<{}} {:>9.2f} {:>8.2f}x {:>13.1f} {:>9} {:>12.1f} {:>9} {:>13.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>13} "
               "{:>8.2f}x {:>11.1f} {:>16} {:>11.2f}\n",
               c, width, static_cast<double>(s.bytes) / (1 << 20), s.ratio, p,
               full_pre > 0 ? fmt::format("{:.2f}x", p / full_pre) : "-", d,
               full_dec > 0 ? fmt::format("{:.2f}x", d / full_dec) : "-", first, median(s.p50_ms),
               median(s.p99_ms), median(s.max_ms), close < 0 ? "-" : fmt::format("{:.2f}", close), s.ratio_end,
               median(s.last_decode),
               peak ? fmt::format("{:.1f}", least(s.prefill_peak) / (1 << 20)) : "-",
               static_cast<double>(s.cache_peak) / (1 << 20));
    rows.push_back({{"cache", c},
                    {"compression_ratio_after_prefill", s.ratio},
                    {"bytes_after_prefill", s.bytes},
                    {"fp16_bytes_every_layer_every_position", s.full},
                    {"prefill_tok_s", p},
                    {"decode_tok_s", d},
                    {"first_decode_step_ms", first},
                    {"decode_step_p50_ms", median(s.p50_ms)},
                    {"decode_step_p99_ms", median(s.p99_ms)},
                    {"decode_step_max_ms", median(s.max_ms)},
                    {"closing_steps", s.close_steps},
                    {"closing_step_max_ms", median(s.close_max_ms) < 0 ? nlohmann::json() : nlohmann::json(median(s.close_max_ms))},
                    {"closing_step_p50_ms", median(s.close_p50_ms) < 0 ? nlohmann::json() : nlohmann::json(median(s.close_p50_ms))},
                    {"last_64_steps_tok_s", median(s.last_decode)},
                    {"compression_ratio_at_end", s.ratio_end},
                    {"bytes_at_end", s.bytes_end},
                    {"prefill_peak_rss_growth_bytes", peak ? nlohmann::json(least(s.prefill_peak)) : nlohmann::json()},
                    {"prefill_cache_peak_bytes", s.cache_peak},
                    {"prefill_samples", s.prefill},
                    {"decode_samples", s.decode}});
  }
  return rows;
}

void bench_runtime(const RuntimeBenchOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  const std::vector<int32_t> prompt = bench_prompt(o, mf);
  for (const auto& c : o.caches) cache::parse_cache_spec(c);
  std::map<std::string, Sample> samples;
  const bool tty = isatty(fileno(stderr));
  for (int rep = 0; rep < o.reps; ++rep)  // caches interleaved within each repetition (same machine state)
    for (const auto& c : o.caches) {
      measure(o, w, c, prompt, samples[c]);
      if (tty) std::fprintf(stderr, "[rep %d/%d] %-24s\r", rep + 1, o.reps, c.c_str());
    }
  const char* activations = o.activations == model::Activations::kInt8 ? "int8" : "f32";
  fmt::print("{}: prompt {} tokens (calls of {}), {} greedy decode steps, theta {}, {} threads, {} activations, "
             "median of {}\n\n",
             o.model, o.ctx, o.prefill_chunk > 0 ? std::to_string(o.prefill_chunk) : std::string("all"), o.n, o.theta,
             core::resolve_threads(o.threads), activations, o.reps);
  const nlohmann::json rows = report(o, samples);
  fmt::print("\n  prefill peak: the most the resident memory grew during the prefill (the prompt's activations,\n"
             "  the same for every cache, and the cache's own share; Linux VmHWM; the least over repetitions,\n"
             "  as the first also faults in the weights: use --reps 2 or more); KV peak: the caches' bytes at\n"
             "  their largest between the prefill's calls (--prefill-chunk); close max: the slowest decode step\n"
             "  that closed a segment (handed one to the background or committed it; - for caches without)\n");
  int64_t local = 0;
  for (int64_t l = 0; l < w.config.n_layers; ++l) local += w.config.is_local(l);
  if (local > 0 && !samples.empty())
    fmt::print("\n  {} of {} layers attend a {}-position window and hold it as a ring (any cache); every layer\n"
               "  holding every position in fp16 would take {:.2f} MiB (ratio column: against that)\n",
               local, w.config.n_layers, w.config.sliding_window,
               static_cast<double>(samples.begin()->second.full) / (1 << 20));
  if (o.json_path.empty()) return;
  std::ofstream(o.json_path) << nlohmann::json{{"model", model_name(o.model)},
                                               {"local_layers", local},
                                               {"sliding_window", w.config.sliding_window},
                                               {"prompt_tokens", o.ctx},
                                               {"prefill_chunk", o.prefill_chunk},
                                               {"decode_tokens", o.n},
                                               {"theta", o.theta},
                                               {"threads", core::resolve_threads(o.threads)},
                                               {"reps", o.reps},
                                               {"activations", activations},
                                               {"results", rows}}
                                    .dump(2);
}

}  // namespace

void register_bench_runtime(CLI::App* bench) {
  auto rb = std::make_shared<RuntimeBenchOptions>();
  CLI::App* rbc =
      bench->add_subcommand("runtime", "Prefill and decode speed of a real model with each cache");
  rbc->add_option("--model,-m", rb->model, "model file")->required();
  rbc->add_option("--text", rb->text, "prompt text (padded with random tokens to --ctx)");
  rbc->add_option("--ctx", rb->ctx, "prompt tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  rbc->add_option("-n", rb->n, "decode steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  rbc->add_option("--caches", rb->caches, cache_option_help("caches"))->delimiter(',');
  rbc->add_option("--theta", rb->theta, "byte budget of the budgeted caches");
  rbc->add_option("--reps", rb->reps, "repetitions (median)")->check(CLI::Range(1, 100));
  rbc->add_option("--threads", rb->threads, "threads (0 = all cores)");
  rbc->add_option("--prefill-chunk", rb->prefill_chunk, "prompt tokens per forward call (0 = the whole prompt in one)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  rbc->add_option("--json", rb->json_path, "write JSON here");
  add_matmul_options(rbc, &rb->activations);
  rbc->callback([rb] { bench_runtime(*rb); });

}

}  // namespace anchorkv::cli
