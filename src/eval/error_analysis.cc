#include "eval/error_analysis.h"

#include <algorithm>
#include <cmath>

#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "cache/registry.h"
#include "core/error.h"
#include "core/half.h"
#include "eval/tasks.h"
#include "core/rope.h"
#include "model/sampler.h"

namespace anchorkv::eval {
namespace {

constexpr const char* kOp = "anchorkv::eval::analyze_errors";

// One layer's captured tensors, head-major [H, T, hd].
struct LayerCapture {
  std::vector<float> q, k_pre, k_post, v;
};

std::vector<LayerCapture> capture(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int threads) {
  const auto& c = w.config;
  const int64_t T = static_cast<int64_t>(toks.size()), hd = c.head_dim;
  std::vector<LayerCapture> layers(static_cast<size_t>(c.n_layers));
  auto head_major = [&](const float* x, int64_t H) {
    std::vector<float> y(static_cast<size_t>(H * T * hd));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) std::copy_n(x + (t * H + h) * hd, hd, &y[(h * T + t) * hd]);
    return y;
  };
  model::LlamaModel m = make_model(w, "full", 0, threads);
  m.set_observer([&](int64_t l, int64_t, const float* q, const float* k_pre, const float* k_post, const float* v) {
    LayerCapture& L = layers[static_cast<size_t>(l)];
    L.q = head_major(q, c.n_heads);
    L.k_pre = head_major(k_pre, c.n_kv_heads);
    L.k_post = head_major(k_post, c.n_kv_heads);
    L.v = head_major(v, c.n_kv_heads);
  });
  m.forward(toks);
  return layers;
}

// Model log-probabilities over the continuation with `make` deciding each layer's cache.
std::vector<std::vector<double>> continuation_logp(const model::LlamaWeights& w, const std::vector<int32_t>& toks,
                                                   int64_t P, const cache::CacheSpec& spec, model::CacheFactory make,
                                                   int threads) {
  model::LlamaModel m(w, std::move(make), threads, spec.pre_rope ? model::KeyRope::kPreRope : model::KeyRope::kPostRope);
  m.set_observation_window(spec.observation_window(), spec.segment_tokens > 0);
  const int64_t V = w.config.vocab;
  std::vector<std::vector<double>> out;
  std::vector<float> logits = m.forward(std::vector<int32_t>(toks.begin(), toks.begin() + P));
  out.push_back(model::log_softmax(logits.data(), V));
  for (int64_t t = P; t + 1 < static_cast<int64_t>(toks.size()); ++t) {
    logits = m.forward({toks[t]});
    out.push_back(model::log_softmax(logits.data(), V));
  }
  return out;
}

double mean_kl(const std::vector<std::vector<double>>& ref, const std::vector<std::vector<double>>& got) {
  double kl = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    for (size_t v = 0; v < ref[i].size(); ++v) kl += std::exp(ref[i][v]) * (ref[i][v] - got[i][v]);
  return kl / static_cast<double>(ref.size());
}

// Which prefix tokens of a row are approximated by an anchor alone (no key
// residual), over every compressed segment.
std::vector<bool> approximated_keys(const KVCache& cache, int64_t row, int64_t P) {
  std::vector<bool> approx(static_cast<size_t>(P), false);
  const auto* a = dynamic_cast<const AnchorKVCache*>(&cache);
  if (!a || !a->is_compressed()) return approx;
  for (const internal::AnchorKVSegment& seg : internal::unlocked_state(*a).segments) {
    const compress::CompressedRow& r = seg.rows[static_cast<size_t>(row)];
    const std::vector<int32_t> anchors = r.anchor_positions();
    int64_t e = 0;
    size_t next = 0;
    for (int64_t t = 0; t < seg.tokens && seg.pos0 + t < P; ++t) {
      if (next < anchors.size() && anchors[next] == t) {
        ++next;
        continue;
      }
      approx[static_cast<size_t>(seg.pos0 + t)] = !r.res_k(e++);
    }
  }
  return approx;
}

// softmax(s) . V over n positions into y; returns the probabilities in p.
void attend_row(const std::vector<float>& s, const float* const* v, int64_t n, int64_t D, std::vector<double>& p,
                std::vector<double>& y) {
  double mx = -1e300, z = 0;
  for (int64_t t = 0; t < n; ++t) mx = std::max(mx, static_cast<double>(s[t]));
  p.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) z += (p[t] = std::exp(s[t] - mx));
  y.assign(static_cast<size_t>(D), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    p[t] /= z;
    for (int64_t d = 0; d < D; ++d) y[d] += p[t] * v[t][d];
  }
}

double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : 0.0;
}

// The errors of one (layer, KV head): exact / reconstructed keys (rotated) and values, [N, D] each.
HeadErrors head_errors(const LayerCapture& L, const std::vector<float>& k_hat, const std::vector<float>& v_hat,
                       const std::vector<bool>& approx, int64_t h, int64_t G, int64_t N, int64_t P, int64_t D,
                       int64_t stride) {
  HeadErrors e;
  const float* K = &L.k_post[static_cast<size_t>(h * N * D)];
  const float* V = &L.v[static_cast<size_t>(h * N * D)];
  std::vector<float> k16(static_cast<size_t>(N * D)), v16(k16.size());
  for (size_t i = 0; i < k16.size(); ++i) {
    k16[i] = core::round_to_half(K[i]);
    v16[i] = core::round_to_half(V[i]);
  }
  std::vector<const float*> v_exact(static_cast<size_t>(N)), v_comp(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    v_exact[t] = &v16[t * D];
    v_comp[t] = t < P ? &v_hat[t * D] : &v16[t * D];
  }
  const double inv = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<float> s, s_hat, s_u, s_i;
  std::vector<double> p, p_hat, y, y_hat, y_k, y_v, y_u, y_i, scratch;
  int64_t n_queries = 0;
  for (int64_t pos = P; pos < N; pos += stride)
    for (int64_t g = 0; g < G; ++g) {
      const float* q = &L.q[static_cast<size_t>(((h * G + g) * N + pos) * D)];
      const int64_t n = pos + 1;
      s.resize(static_cast<size_t>(n));
      s_hat.resize(s.size());
      for (int64_t t = 0; t < n; ++t) {
        double a = 0, b = 0;
        for (int64_t d = 0; d < D; ++d) {
          a += static_cast<double>(q[d]) * k16[t * D + d];
          b += static_cast<double>(q[d]) * (t < P ? k_hat[t * D + d] : k16[t * D + d]);
        }
        s[t] = static_cast<float>(a * inv);
        s_hat[t] = static_cast<float>(b * inv);
      }
      attend_row(s, v_exact.data(), n, D, p, y);
      attend_row(s_hat, v_comp.data(), n, D, p_hat, y_hat);
      attend_row(s_hat, v_exact.data(), n, D, scratch, y_k);
      attend_row(s, v_comp.data(), n, D, scratch, y_v);
      s_u = s;
      s_i = s;
      double mass = 0, mass_hat = 0;
      for (int64_t t = 0; t < P; ++t) {
        if (!approx[static_cast<size_t>(t)]) continue;
        mass += p[t];
        mass_hat += p_hat[t];
        (p[t] < 1.0 / static_cast<double>(n) ? s_u : s_i)[t] = s_hat[t];
      }
      attend_row(s_u, v_exact.data(), n, D, scratch, y_u);
      attend_row(s_i, v_exact.data(), n, D, scratch, y_i);
      e.err += rel_err(y_hat, y);
      e.key_err += rel_err(y_k, y);
      e.value_err += rel_err(y_v, y);
      e.unimportant_key_err += rel_err(y_u, y);
      e.important_key_err += rel_err(y_i, y);
      e.approx_mass_true += mass;
      e.approx_mass_cache += mass_hat;
      ++n_queries;
    }
  const double nq = static_cast<double>(std::max<int64_t>(1, n_queries));
  for (double* x : {&e.err, &e.key_err, &e.value_err, &e.unimportant_key_err, &e.important_key_err,
                    &e.approx_mass_true, &e.approx_mass_cache})
    *x /= nq;
  e.approx_share = static_cast<double>(std::count(approx.begin(), approx.end(), true)) / static_cast<double>(P);
  return e;
}

// The layer's prefix handed to a fresh cache of `spec`, as the runtime would
// (keys in the spec's RoPE domain, the observation queries it asks for).
std::unique_ptr<KVCache> compress_layer(const LayerCapture& L, const cache::CacheSpec& spec, double theta,
                                        int threads, const model::LlamaConfig& c, int64_t N, int64_t P,
                                        const RopeOptions& rope) {
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, D = c.head_dim;
  const std::vector<float>& K = spec.pre_rope ? L.k_pre : L.k_post;
  std::vector<float> kp(static_cast<size_t>(Hk * P * D)), vp(kp.size());
  for (int64_t h = 0; h < Hk; ++h) {
    std::copy_n(&K[static_cast<size_t>(h * N * D)], P * D, &kp[static_cast<size_t>(h * P * D)]);
    std::copy_n(&L.v[static_cast<size_t>(h * N * D)], P * D, &vp[static_cast<size_t>(h * P * D)]);
  }
  std::unique_ptr<KVCache> cache = make_layer_cache(spec, c, theta, threads);
  const TensorView kv_k = TensorView::f32(kp.data(), {1, Hk, P, D}), kv_v = TensorView::f32(vp.data(), {1, Hk, P, D});
  const int64_t win = spec.observation_window();
  if (win == 0) {
    cache->update(kv_k, kv_v);
    return cache;
  }
  const int64_t W = win < 0 ? P : std::min(win, P);
  std::vector<float> qw(static_cast<size_t>(Hq * W * D));
  for (int64_t hq = 0; hq < Hq; ++hq)
    for (int64_t j = 0; j < W; ++j) {
      float* dst = &qw[static_cast<size_t>((hq * W + j) * D)];
      std::copy_n(&L.q[static_cast<size_t>((hq * N + P - W + j) * D)], D, dst);
      if (spec.pre_rope) core::rope_rotate_at(dst, D, rope, P - W + j, /*inverse=*/true);  // captured rotated
    }
  cache->update(kv_k, kv_v, TensorView::f32(qw.data(), {1, Hq, W, D}));
  return cache;
}

// Every head's errors of one layer.
void layer_errors(const LayerCapture& L, const cache::CacheSpec& spec, double theta, int threads,
                  const model::LlamaConfig& c, int64_t l, int64_t N, int64_t P, int64_t stride, const RopeOptions& rope,
                  std::vector<HeadErrors>& out) {
  const int64_t D = c.head_dim, Hk = c.n_kv_heads, G = c.n_heads / c.n_kv_heads;
  const std::unique_ptr<KVCache> cache = compress_layer(L, spec, theta, threads, c, N, P, rope);
  const KVPair rec = cache->fetch();
  const std::vector<float> k_rec = rec.keys.to_f32(), v_rec = rec.values.to_f32();
  for (int64_t h = 0; h < Hk; ++h) {
    std::vector<float> k_hat(k_rec.begin() + h * P * D, k_rec.begin() + (h + 1) * P * D);
    std::vector<float> v_hat(v_rec.begin() + h * P * D, v_rec.begin() + (h + 1) * P * D);
    if (spec.pre_rope)
      for (int64_t t = 0; t < P; ++t) core::rope_rotate_at(&k_hat[t * D], D, rope, t);
    HeadErrors e = head_errors(L, k_hat, v_hat, approximated_keys(*cache, h, P), h, G, N, P, D, stride);
    e.layer = l;
    e.kv_head = h;
    out.push_back(e);
  }
}

// The mean of a layer's heads.
HeadErrors mean_of_heads(const std::vector<HeadErrors>& heads, int64_t l) {
  HeadErrors m;
  m.layer = l;
  double n = 0;
  for (const HeadErrors& e : heads) {
    if (e.layer != l) continue;
    n += 1;
    m.err += e.err;
    m.key_err += e.key_err;
    m.value_err += e.value_err;
    m.unimportant_key_err += e.unimportant_key_err;
    m.important_key_err += e.important_key_err;
    m.approx_mass_true += e.approx_mass_true;
    m.approx_mass_cache += e.approx_mass_cache;
    m.approx_share += e.approx_share;
  }
  for (double* x : {&m.err, &m.key_err, &m.value_err, &m.unimportant_key_err, &m.important_key_err,
                    &m.approx_mass_true, &m.approx_mass_cache, &m.approx_share})
    *x /= std::max(1.0, n);
  return m;
}

}  // namespace

ErrorAnalysis analyze_errors(const model::LlamaWeights& w, const std::vector<int32_t>& toks, int64_t P,
                             const std::string& spec_text, double theta, int threads, int64_t stride) {
  const cache::CacheSpec spec = cache::parse_cache_spec(spec_text);  // the prefix compressed once
  if (spec.kind->evicts)
    core::fail(ErrorCode::kInvalidArgument, kOp, "cache '" + spec_text + "' evicts tokens: the analysis needs every position");
  const int64_t N = static_cast<int64_t>(toks.size());
  if (P < 2 || P >= N) core::fail(ErrorCode::kInvalidArgument, kOp, "the prefix must leave tokens after it");
  if (stride < 1) core::fail(ErrorCode::kInvalidArgument, kOp, "stride must be >= 1");
  const auto& c = w.config;
  const RopeOptions& rope = c.rope;
  ErrorAnalysis out;
  const std::vector<LayerCapture> layers = capture(w, toks, threads);
  for (int64_t l = 0; l < c.n_layers; ++l)
    layer_errors(layers[static_cast<size_t>(l)], spec, spec.layer_theta(theta, l, c.n_layers), threads, c, l, N, P,
                 stride, rope, out.heads);

  const auto ref = continuation_logp(w, toks, P, cache::parse_cache_spec("full"),
                                     [](int64_t) { return std::make_unique<FullKVCache>(); }, threads);
  auto make = [&](int64_t l) { return make_layer_cache(spec, w.config, spec.layer_theta(theta, l, c.n_layers), threads); };
  out.kl_all = mean_kl(ref, continuation_logp(w, toks, P, spec, make, threads));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto only_l = [&](int64_t i) -> std::unique_ptr<KVCache> {
      if (i == l) return make(l);
      return std::make_unique<FullKVCache>();
    };
    out.layers.push_back({l, mean_kl(ref, continuation_logp(w, toks, P, spec, only_l, threads)),
                          mean_of_heads(out.heads, l)});
  }
  return out;
}

}  // namespace anchorkv::eval
