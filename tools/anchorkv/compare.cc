// `anchorkv compare`: every method at the same byte budget on one workload.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "anchorkv/status.h"
#include "commands.h"
#include "core/error.h"
#include "cache/registry.h"
#include "eval/compare.h"

namespace anchorkv::cli {
namespace {

// A small SVG line plot: mean attention error vs compression ratio (log x), one series per method.
std::string svg_plot(const std::vector<eval::CompareRow>& rows, const std::vector<std::string>& methods,
                     const std::string& title) {
  const double W = 760, H = 480, L = 70, R = 170, T = 40, B = 60;
  double xmax = 2, ymax = 0.1;
  for (const auto& r : rows) {
    xmax = std::max(xmax, r.compression_ratio);
    ymax = std::max(ymax, r.error.mean);
  }
  xmax = std::pow(2.0, std::ceil(std::log2(xmax)));
  ymax = std::ceil(ymax * 5) / 5;
  auto X = [&](double ratio) { return L + (W - L - R) * std::log2(std::max(ratio, 1.0)) / std::log2(xmax); };
  auto Y = [&](double e) { return T + (H - T - B) * (1 - e / ymax); };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                          "#bcbd22", "#17becf"};
  std::string o = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='12'>\n"
      "<rect width='100%' height='100%' fill='white'/>\n<text x='{}' y='22' font-size='15'>{}</text>\n",
      W, H, L, title);
  for (double x = 1; x <= xmax; x *= 2)
    o += fmt::format("<line x1='{0:.1f}' y1='{1}' x2='{0:.1f}' y2='{2}' stroke='#ddd'/><text x='{0:.1f}' y='{3}' "
                     "text-anchor='middle'>{4}x</text>\n",
                     X(x), T, H - B, H - B + 18, x);
  for (int i = 0; i <= 5; ++i) {
    const double e = ymax * i / 5;
    o += fmt::format("<line x1='{0}' y1='{1:.1f}' x2='{2}' y2='{1:.1f}' stroke='#ddd'/><text x='{3}' y='{4:.1f}' "
                     "text-anchor='end'>{5:.2f}</text>\n",
                     L, Y(e), W - R, L - 6, Y(e) + 4, e);
  }
  o += fmt::format("<text x='{}' y='{}' text-anchor='middle'>compression ratio (fp16 bytes / stored bytes)</text>\n",
                   (L + W - R) / 2, H - 18);
  o += fmt::format("<text x='18' y='{}' transform='rotate(-90 18 {})' text-anchor='middle'>attention rel. error "
                   "(mean)</text>\n",
                   (T + H - B) / 2, (T + H - B) / 2);
  int ci = 0;
  for (const auto& m : methods) {
    const char* c = colors[ci % 10];
    std::vector<std::pair<double, double>> pts;
    for (const auto& r : rows)
      if (r.method == m) pts.emplace_back(r.compression_ratio, r.error.mean);
    std::sort(pts.begin(), pts.end());
    pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
    std::string line;
    for (const auto& [x, y] : pts) {
      line += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
      o += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3.5' fill='{}'/>\n", X(x), Y(y), c);
    }
    o += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='2'/>\n", line, c);
    o += fmt::format("<rect x='{}' y='{}' width='14' height='4' fill='{}'/><text x='{}' y='{}'>{}</text>\n", W - R + 15,
                     T + 10 + 20 * ci, c, W - R + 35, T + 15 + 20 * ci, m);
    ++ci;
  }
  return o + "</svg>\n";
}

struct Options {
  std::string workload = "synthetic";
  std::vector<double> thetas = {0.02, 0.05, 0.1, 0.2};
  std::vector<std::string> methods = {"all"};
  eval::SyntheticSpec spec;
  std::string json_path, csv_path, plot_path;
  int64_t layer = -1, held_out = 32;
  int threads = 0;
  std::string keys = "post";
};

void run(Options opt) {
  if (opt.methods.size() == 1 && opt.methods[0] == "all") {
    opt.methods = cache::cache_names();
    if (opt.keys == "pre")  // eviction loses positions: those methods need post-RoPE keys
      std::erase_if(opt.methods, [](const std::string& m) { return m == "streamingllm" || m == "snapkv" || m == "h2o"; });
  }
  if (opt.keys == "pre" && opt.workload == "synthetic")
    core::fail(ErrorCode::kInvalidArgument, "anchorkv compare",
               "--keys pre needs a dump (the synthetic workload has its own --rope switch)");
  for (const auto& m : opt.methods) cache::parse_cache_spec(m);  // validates names up front
  const bool synthetic = opt.workload == "synthetic";
  std::string source = "Synthetic workload";
  eval::Workload w;
  if (synthetic) {
    w = eval::make_synthetic(opt.spec);
  } else {  // a K/V dump written by `anchorkv dump-kv`
    int64_t layer = 0;
    w = eval::workload_from_dump(opt.workload, opt.layer, opt.held_out, &layer, opt.keys == "pre");
    source = fmt::format("Dump {} layer {}{}", opt.workload, layer, opt.keys == "pre" ? ", keys before RoPE" : "");
  }
  opt.spec = w.spec;
  const bool tty = isatty(fileno(stderr));
  const auto rows = eval::compare(w, opt.thetas, opt.methods, opt.threads, [&](int i, int n, const std::string& what) {
    if (!tty) return;
    const int width = 30, fill = width * i / n;
    std::fprintf(stderr, "\r[%s%s] %d/%d %-40s", std::string(fill, '#').c_str(), std::string(width - fill, ' ').c_str(),
                 i, n, what.c_str());
    if (i == n) std::fprintf(stderr, "\n");
  });

  const auto& sp = opt.spec;
  fmt::print("{}: B={} H={} S={} D={}, {} held-out queries per head{}\n\n", source, sp.B, sp.H, sp.S, sp.D,
             sp.n_queries, synthetic ? fmt::format(" (seed {})", sp.seed) : "");
  fmt::print("  {:>5} {:<17} {:>11} {:>7} {:>6} {:>13} {:>9} {:>9} {:>8} {:>10}\n", "theta", "method", "bytes",
             "ratio", "budget", "tokens kept", "err mean", "err p95", "cosine", "prefill ms");
  nlohmann::json j = nlohmann::json::array();
  std::string csv =
      "theta,method,bytes,full_bytes,budget_bytes,compression_ratio,over_budget,tokens_kept,tokens_total,"
      "rel_error_mean,rel_error_p95,cosine,compress_ms\n";
  for (const auto& r : rows) {
    const std::string budget = r.method == "full" ? "-" : r.over_budget ? "OVER" : r.under_budget ? "under" : "ok";
    fmt::print("  {:>5} {:<17} {:>11} {:>6.1f}x {:>6} {:>13} {:>9.4f} {:>9.4f} {:>8.4f} {:>10.1f}\n", r.theta, r.method,
               r.bytes, r.compression_ratio, budget, fmt::format("{}/{}", r.tokens_kept, r.tokens_total),
               r.error.mean, r.error.p95, r.error.mean_cosine, r.compress_ms);
    j.push_back({{"theta", r.theta}, {"method", r.method}, {"bytes", r.bytes}, {"full_bytes", r.full_bytes},
                 {"budget_bytes", r.budget_bytes}, {"compression_ratio", r.compression_ratio},
                 {"over_budget", r.over_budget}, {"under_budget", r.under_budget}, {"tokens_kept", r.tokens_kept}, {"tokens_total", r.tokens_total},
                 {"rel_error_mean", r.error.mean}, {"rel_error_p95", r.error.p95}, {"cosine", r.error.mean_cosine},
                 {"compress_ms", r.compress_ms}});
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.theta, r.method, r.bytes, r.full_bytes,
                       r.budget_bytes, r.compression_ratio, r.over_budget ? 1 : 0, r.tokens_kept, r.tokens_total,
                       r.error.mean, r.error.p95, r.error.mean_cosine, r.compress_ms);
  }
  fmt::print(
      "\n  budget: 'ok' = within 2% of theta x fp16 bytes; 'OVER' = the method's smallest size is larger;\n"
      "          'under' = the method cannot spend the budget (e.g. every AnchorKV token already has a residual)\n");
  auto write = [](const std::string& path, const std::string& text) {
    if (path.empty()) return;
    std::ofstream f(path);
    if (!f) core::fail(ErrorCode::kInvalidArgument, "anchorkv compare", "cannot write '" + path + "'");
    f << text;
  };
  write(opt.json_path,
        nlohmann::json{{"workload", {{"kind", synthetic ? "synthetic" : "dump"}, {"source", source}, {"B", sp.B},
                                     {"H", sp.H}, {"S", sp.S}, {"D", sp.D},
                                     {"queries_per_head", sp.n_queries}, {"seed", sp.seed}}},
                       {"results", j}}
                .dump(2));
  write(opt.csv_path, csv);
  write(opt.plot_path,
        svg_plot(rows, opt.methods,
                 fmt::format("{} (S={}, H={}, D={}): error vs compression", source, sp.S, sp.H, sp.D)));
}

}  // namespace

void register_compare(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("compare", "Every method at the same bytes: attention error on held-out queries");
  sub->add_option("--workload", opt->workload, "workload: synthetic, or a K/V dump file from `anchorkv dump-kv`");
  sub->add_option("--layer", opt->layer, "dump layer (default: the middle one)");
  sub->add_option("--held-out", opt->held_out, "dump positions whose queries are held out")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--theta", opt->thetas, "byte budgets (fraction of fp16)")->delimiter(',');
  sub->add_option("--methods", opt->methods, "methods or 'all': " + fmt::format("{}", fmt::join(cache::cache_names(), ",")))
      ->delimiter(',');
  sub->add_option("--seq,-S", opt->spec.S, "prefill length")->check(CLI::Range(2, 1 << 22));
  sub->add_option("--heads,-H", opt->spec.H, "KV heads")->check(CLI::Range(1, 256));
  sub->add_option("--head-dim,-D", opt->spec.D, "head dimension")->check(CLI::Range(1, 1024));
  sub->add_option("--queries", opt->spec.n_queries, "held-out queries per head")->check(CLI::Range(1, 4096));
  sub->add_option("--clusters", opt->spec.clusters, "token clusters per head")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--workload-seed", opt->spec.seed, "workload seed");
  sub->add_option("--json", opt->json_path, "write JSON here");
  sub->add_option("--csv", opt->csv_path, "write CSV here");
  sub->add_option("--plot", opt->plot_path, "write an SVG plot of error vs compression ratio here");
  sub->add_option("--threads", opt->threads, "threads (0 = all cores)");
  sub->add_option("--keys", opt->keys, "dumps: cache keys after RoPE (post, the seed's) or before (pre, the paper's)")
      ->check(CLI::IsMember({"post", "pre"}));
  sub->callback([opt] { run(*opt); });
}

}  // namespace anchorkv::cli
