// `anchorkv codec-mse`: measured residual MSE of the codec's two scales
// (seed absmax vs RMS) on synthetic residual distributions, D x bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "compress/codec.h"
#include "compress/compressor.h"
#include "core/convert.h"
#include "core/rng.h"
#include "eval/workload.h"

namespace anchorkv::cli {
namespace {

double gaussian(core::Rng& rng) {
  double u1 = rng.uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * rng.uniform());
}

// kind: "gaussian" (iid N(0,1)), "outlier" (N(0,1) plus 2 channels x 20),
// "laplace" (heavy-tailed iid Laplace); "anchorkv" uses workload_residuals().
void draw(const std::string& kind, core::Rng& rng, std::vector<float>& r, const std::vector<int64_t>& outlier_ch) {
  for (auto& x : r) {
    if (kind == "laplace") {
      const double u = rng.uniform() - 0.5;
      x = static_cast<float>(-(u < 0 ? -1 : 1) * std::log(1 - 2 * std::fabs(u)) / std::sqrt(2.0));
    } else {
      x = static_cast<float>(gaussian(rng));
    }
  }
  if (kind == "outlier")
    for (int64_t c : outlier_ch) r[c] *= 20.0f;
}

// Real AnchorKV residuals: r_t = x_t - gamma_t x_a(t) of the non-anchor tokens of
// the built-in synthetic workload (keys and values), as compression produces them.
std::vector<std::vector<float>> workload_residuals(int64_t D, int64_t count) {
  eval::SyntheticSpec spec;
  spec.H = 2;
  spec.S = 4096;
  spec.D = D;
  spec.n_queries = 1;
  eval::Workload w = eval::make_synthetic(spec);
  core::round_to_f16_n(w.K.data(), w.K.data(), static_cast<int64_t>(w.K.size()));
  core::round_to_f16_n(w.V.data(), w.V.data(), static_cast<int64_t>(w.V.size()));
  compress::SegmentInput in{spec.B, spec.H, spec.S, D, w.K.data(), w.V.data()};
  const auto analysis = compress::analyze(in, AnchorKVConfig{});
  std::vector<std::vector<float>> out;
  for (int64_t i = 0; static_cast<int64_t>(out.size()) < count && i < spec.H * spec.S; ++i) {
    const int64_t row = i % spec.H, t = (i / spec.H) * 7 % spec.S;  // spread over positions
    const auto& a = analysis[row];
    if (std::binary_search(a.anchors.begin(), a.anchors.end(), static_cast<int32_t>(t))) continue;
    for (int side = 0; side < 2; ++side) {
      const float* X = side == 0 ? in.key_row(row) : in.value_row(row);
      const auto& as = side == 0 ? a.k : a.v;
      std::vector<float> r(static_cast<size_t>(D));
      compress::residual(X + t * D, X + a.anchors[as.anchor[t]] * D, as.coef[t], D, r.data());
      out.push_back(std::move(r));
    }
  }
  return out;
}

struct Options {
  int64_t samples = 4000;
  uint64_t seed = 7;
  bool json = false;
};

void run(const Options& opt) {
  nlohmann::json results = nlohmann::json::array();
  if (!opt.json) {
    fmt::print("Residual codec: relative MSE  E||r - r^||^2 / E||r||^2  ({} vectors per cell)\n\n", opt.samples);
    fmt::print("  {:<9} {:>4} {:>4}  {:>10} {:>10}  {:>8}\n", "residuals", "D", "bits", "absmax", "rms", "winner");
  }
  for (const std::string kind : {"gaussian", "outlier", "laplace", "anchorkv"}) {
    for (int64_t D : {64, 128}) {
      const auto real = kind == "anchorkv" ? workload_residuals(D, opt.samples) : std::vector<std::vector<float>>{};
      for (int bits = 1; bits <= 4; ++bits) {
        double mse[2] = {0, 0};
        for (int s = 0; s < 2; ++s) {
          const ResidualScale scale = s == 0 ? ResidualScale::kAbsMax : ResidualScale::kRms;
          compress::ResidualCodec codec(D, bits, scale, 42);
          core::Rng rng(opt.seed);  // same vectors for both scales
          std::vector<float> r(static_cast<size_t>(D)), out(static_cast<size_t>(D)), scratch(2 * static_cast<size_t>(D));
          std::vector<uint8_t> codes(static_cast<size_t>(codec.code_bytes())), tmp(static_cast<size_t>(D));
          const std::vector<int64_t> outlier_ch = {3, D / 2 + 1};
          double err = 0, en = 0;
          const int64_t n = kind == "anchorkv" ? static_cast<int64_t>(real.size()) : opt.samples;
          for (int64_t i = 0; i < n; ++i) {
            if (kind == "anchorkv")
              r = real[static_cast<size_t>(i)];
            else
              draw(kind, rng, r, outlier_ch);
            uint16_t sc;
            codec.encode(r.data(), codes.data(), &sc, scratch.data());
            codec.decode(codes.data(), sc, out.data(), tmp.data());
            for (int64_t d = 0; d < D; ++d) {
              err += (r[d] - out[d]) * static_cast<double>(r[d] - out[d]);
              en += static_cast<double>(r[d]) * r[d];
            }
          }
          mse[s] = err / en;
        }
        const char* winner = mse[1] < mse[0] ? "rms" : "absmax";
        results.push_back({{"residuals", kind}, {"D", D}, {"bits", bits}, {"absmax_rel_mse", mse[0]},
                           {"rms_rel_mse", mse[1]}, {"winner", winner}});
        if (!opt.json)
          fmt::print("  {:<9} {:>4} {:>4}  {:>10.5f} {:>10.5f}  {:>8}\n", kind, D, bits, mse[0], mse[1], winner);
      }
    }
  }
  if (opt.json) std::printf("%s\n", nlohmann::json{{"samples", opt.samples}, {"results", results}}.dump(2).c_str());
}

}  // namespace

void register_codec_mse(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("codec-mse", "Measure residual MSE of the absmax and RMS codec scales");
  sub->add_option("--samples", opt->samples, "vectors per cell")->check(CLI::Range(1, 10000000));
  sub->add_option("--seed", opt->seed, "seed of the residual generator");
  sub->add_flag("--json", opt->json, "print JSON");
  sub->callback([opt] { run(*opt); });
}

}  // namespace anchorkv::cli
