#include "eval/workload.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "io/kvdump.h"
#include "core/rng.h"

namespace anchorkv::eval {

namespace {
double gaussian(core::Rng& rng) {
  // Box-Muller (the cosine branch only, for simplicity).
  double u1 = rng.uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

void apply_rope(float* x, int64_t D, int64_t pos, double base) {
  thread_local std::vector<double> freqs;
  thread_local double freqs_base = 0;
  if (static_cast<int64_t>(freqs.size()) != D / 2 || freqs_base != base) {
    freqs.resize(static_cast<size_t>(D / 2));
    for (int64_t i = 0; i + 1 < D; i += 2) freqs[i / 2] = std::pow(base, -static_cast<double>(i) / static_cast<double>(D));
    freqs_base = base;
  }
  for (int64_t i = 0; i + 1 < D; i += 2) {
    const double freq = freqs[i / 2];
    const double a = static_cast<double>(pos) * freq;
    const double c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + 1];
    x[i] = static_cast<float>(x0 * c - x1 * s);
    x[i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

Workload make_synthetic(const SyntheticSpec& spec) {
  Workload w;
  w.spec = spec;
  const int64_t B = spec.B, H = spec.H, S = spec.S, D = spec.D, nq = spec.n_queries, C = spec.clusters;
  w.K.resize(static_cast<size_t>(B * H * S * D));
  w.V.resize(w.K.size());
  w.Q.resize(static_cast<size_t>(B * H * nq * D));
  // Centre std chosen so a same-cluster logit q.k/sqrt(D) is about 5.
  const double centre_std = std::sqrt(5.0 / std::sqrt(static_cast<double>(D)));
  core::parallel_for(B * H, 0, [&](int64_t row) {
    core::Rng rng(core::stream_seed(spec.seed, static_cast<uint64_t>(row)));
    std::vector<float> kc(static_cast<size_t>(C * D)), vc(static_cast<size_t>(C * D));
    for (auto& x : kc) x = static_cast<float>(centre_std * gaussian(rng));
    for (auto& x : vc) x = static_cast<float>(gaussian(rng));
    std::vector<float> bias(static_cast<size_t>(D), 0.0f), sink(static_cast<size_t>(D));
    for (int64_t i = 0; i < spec.outlier_channels && i < D; ++i)
      bias[rng.below(static_cast<uint64_t>(D))] = static_cast<float>(spec.outlier_scale * (rng.below(2) ? 1 : -1));
    double norm = 0;
    for (auto& x : sink) {
      x = static_cast<float>(gaussian(rng));
      norm += x * x;
    }
    for (auto& x : sink) x = static_cast<float>(x / std::sqrt(norm));
    std::vector<int32_t> cluster(static_cast<size_t>(S));
    int32_t c = static_cast<int32_t>(rng.below(static_cast<uint64_t>(C)));
    for (int64_t t = 0; t < S; ++t) {
      if (rng.uniform() > spec.stay) c = static_cast<int32_t>(rng.below(static_cast<uint64_t>(C)));
      cluster[t] = c;
    }
    const double sqrt_d = std::sqrt(static_cast<double>(D));
    auto make_key = [&](float* k, int32_t cl, int64_t pos, bool is_sink) {
      const double mag = std::exp(0.2 * gaussian(rng));
      for (int64_t d = 0; d < D; ++d) {
        const double base = is_sink ? 2.5 * sqrt_d * sink[d]
                                    : kc[cl * D + d] + spec.noise * centre_std * gaussian(rng);
        k[d] = static_cast<float>(mag * base + bias[d]);
      }
      if (spec.rope) apply_rope(k, D, pos, spec.rope_base);
    };
    float* K = &w.K[static_cast<size_t>(row * S * D)];
    float* V = &w.V[static_cast<size_t>(row * S * D)];
    for (int64_t t = 0; t < S; ++t) {
      make_key(K + t * D, cluster[t], t, t < spec.sinks);
      for (int64_t d = 0; d < D; ++d)
        V[t * D + d] = static_cast<float>(vc[cluster[t] * D + d] + spec.noise * gaussian(rng));
    }
    float* Q = &w.Q[static_cast<size_t>(row * nq * D)];
    for (int64_t i = 0; i < nq; ++i) {
      const int32_t cl = cluster[rng.below(static_cast<uint64_t>(S))];
      float* q = Q + i * D;
      for (int64_t d = 0; d < D; ++d)
        q[d] = static_cast<float>(kc[cl * D + d] + spec.noise * centre_std * gaussian(rng) + 0.5 * sink[d]);
      if (spec.rope) apply_rope(q, D, spec.query_position >= 0 ? spec.query_position : S + i, spec.rope_base);
    }
  });
  return w;
}

Workload workload_from_dump(const std::string& path, int64_t layer, int64_t held_out, int64_t* layer_used,
                            bool keys_pre_rope) {
  const io::KVDump d = io::read_kvdump(path);
  constexpr const char* op = "anchorkv::eval::workload_from_dump";
  if (layer < 0) layer = static_cast<int64_t>(d.layers.size()) / 2;
  if (layer_used) *layer_used = layer;
  if (layer < 0 || layer >= static_cast<int64_t>(d.layers.size()))
    core::fail(ErrorCode::kInvalidArgument, op,
               "layer " + std::to_string(layer) + " is not in the dump (" + std::to_string(d.layers.size()) + " layers)");
  const int64_t N = static_cast<int64_t>(d.n_tokens), D = d.head_dim, Hk = d.n_kv_heads, Hq = d.n_heads, G = Hq / Hk;
  if (held_out < 1 || held_out >= N - 1)
    core::fail(ErrorCode::kInvalidArgument, op,
               "held_out must be in [1, " + std::to_string(N - 2) + "] for a dump of " + std::to_string(N) + " tokens");
  const int64_t S = N - held_out;
  const io::KVDumpLayer& L = d.layers[static_cast<size_t>(layer)];
  Workload w;
  w.spec.B = 1;
  w.spec.H = Hk;
  w.spec.S = S;
  w.spec.D = D;
  w.spec.n_queries = G * held_out;
  w.spec.rope = true;
  w.K.resize(static_cast<size_t>(Hk * S * D));
  w.V.resize(w.K.size());
  w.Q.resize(static_cast<size_t>(Hk * G * held_out * D));
  if (keys_pre_rope) {
    if (d.rope_base <= 0)
      core::fail(ErrorCode::kInvalidArgument, op,
                 "'" + path + "' records no RoPE base (a version 1 dump): write it again with dump-kv");
    w.keys_pre_rope = true;
    w.rope_base = d.rope_base;
    w.rope_neox = d.rope_style == 1;
    w.K_exact.resize(w.K.size());
    for (int64_t h = 0; h < Hk; ++h) std::copy_n(&L.k_post[h * N * D], S * D, &w.K_exact[h * S * D]);
  }
  const std::vector<float>& K = keys_pre_rope ? L.k_pre : L.k_post;
  for (int64_t h = 0; h < Hk; ++h) {
    std::copy_n(&K[h * N * D], S * D, &w.K[h * S * D]);
    std::copy_n(&L.v[h * N * D], S * D, &w.V[h * S * D]);
    for (int64_t g = 0; g < G; ++g)
      std::copy_n(&L.q[((h * G + g) * N + S) * D], held_out * D, &w.Q[((h * G + g) * held_out) * D]);
  }
  return w;
}

}  // namespace anchorkv::eval
