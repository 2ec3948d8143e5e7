// LlamaModel: the forward pass as named per-layer steps.
//
//   x = embed(tokens)                                   [T, dim]
//   per layer:  attention block   xn = norm(x); q, k, v = project(xn);
//                                 q, k = head norms, RoPE; a = attend(q, cache + k, v);
//                                 x += post_norm(Wo a)
//               FFN block         xn = norm(x); x += post_norm(Wdown act(Wgate xn) * Wup xn)
//   logits = output(norm(x))
//
// One name per tensor state: `q`, `k`, `v` are the projections (token-major
// [T, heads, head_dim]); RoPE rotates them in place, except that pre-RoPE
// caches need the unrotated keys, so `k_rot` is the rotated copy there.
#include <algorithm>
#include <cmath>
#include <functional>

#include "cache/cache_traits.h"
#include "core/error.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/rope.h"
#include "kernels/causal_attention.h"
#include "model/llama.h"

namespace anchorkv::model {

namespace {
constexpr const char* kForward = "anchorkv::LlamaModel::forward";

void rmsnorm(const float* x, const float* g, int64_t D, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
  for (int64_t i = 0; i < D; ++i) out[i] = x[i] * inv * g[i];
}

// fn(t0, t1) over chunks of a call's tokens on the threads (per-token work:
// norms, RoPE, SwiGLU, layout copies; left serial, they had been a quarter
// of a 512-token prefill's single-thread time). Small calls run inline.
void for_tokens(int64_t T, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kChunk = 16;
  if (T <= kChunk) return fn(0, T);
  core::parallel_for((T + kChunk - 1) / kChunk, threads,
                     [&](int64_t i) { fn(i * kChunk, std::min(T, (i + 1) * kChunk)); });
}

// y[t, :] += b for every row t (nothing when b is empty).
void add_bias(float* y, int64_t T, const std::vector<float>& b) {
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) y[t * n + i] += b[i];
}

// The chunk's queries over an exact cache's positions and the chunk's own
// (post-RoPE keys, head-major): the blocked causal kernel over the two put
// together, each query seeing the last `window` keys (0: all before it).
Tensor attention_after_exact(const KVCache& held_cache, const TensorView& kv_k, const TensorView& kv_v,
                             const TensorView& q_view, int64_t window, bool reference, int threads) {
  const int64_t Hq = q_view.shape[1], Hk = kv_k.shape[1], T = kv_k.shape[2], hd = kv_k.shape[3];
  const KVPair held = held_cache.fetch();
  const int64_t before = held_cache.offset() > 0 ? held.keys.shape()[2] : 0, N = before + T;
  std::vector<float> k(static_cast<size_t>(Hk * N * hd)), v(k.size());
  const std::vector<float> hk = before ? held.keys.to_f32() : std::vector<float>(),
                           hv = before ? held.values.to_f32() : std::vector<float>();
  for (int64_t h = 0; h < Hk; ++h) {
    std::copy_n(hk.data() + h * before * hd, before * hd, &k[static_cast<size_t>(h * N * hd)]);
    std::copy_n(hv.data() + h * before * hd, before * hd, &v[static_cast<size_t>(h * N * hd)]);
    std::copy_n(static_cast<const float*>(kv_k.data) + h * T * hd, T * hd, &k[static_cast<size_t>((h * N + before) * hd)]);
    std::copy_n(static_cast<const float*>(kv_v.data) + h * T * hd, T * hd, &v[static_cast<size_t>((h * N + before) * hd)]);
  }
  Tensor y(DType::kF32, {1, Hq, T, hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto* q = static_cast<const float*>(q_view.data);
  if (reference)
    kernels::causal_attention_ref(q, k.data(), v.data(), Hq, Hk, T, N, hd, scale, window, y.data_as<float>());
  else
    kernels::causal_attention(q, k.data(), v.data(), Hq, Hk, T, N, hd, scale, window, y.data_as<float>(), threads);
  return y;
}

// A prefill chunk attends over what the cache held before it — read as
// stored, never densified — followed by the chunk itself held exactly; the
// cache compresses or evicts the chunk afterwards (the paper compresses "at
// the end of prefill"; SnapKV/H2O score then evict). For the first chunk (an
// empty cache) pre-RoPE keys arrive rotated (`k_rot`, head-major) and
// attention needs no RoPE; otherwise the chunk is stored like the cache's keys
// and `ao` carries the RoPE of pre-RoPE caches.
Tensor prefill_attention(const KVCache& cache, const float* k_rot, const TensorView& kv_k, const TensorView& kv_v,
                         const TensorView& q_view, const AttentionOptions& ao) {
  FullKVCache chunk;
  if (cache.offset() > 0) {
    // A later chunk of a long prompt over an exact post-RoPE cache: the
    // blocked causal kernel over both (per-query attend over the cache took
    // 1.5x the prefill time at 32K in chunks of 2048).
    if (internal::holds_exact_run(cache) && !ao.rope.enabled && ao.scale == 0.0f && !ao.reference)
      return attention_after_exact(cache, kv_k, kv_v, q_view, 0, false, ao.threads);
    chunk.update(kv_k, kv_v);
    return attend(q_view, {&cache, &chunk}, ao);
  }
  const int64_t Hq = q_view.shape[1], Hk = kv_k.shape[1], T = kv_k.shape[2], hd = kv_k.shape[3];
  const TensorView keys = k_rot ? TensorView::f32(k_rot, {1, Hk, T, hd}) : kv_k;
  if (ao.reference || ao.scale != 0.0f) {  // attend() over the chunk: the reference
    chunk.update(keys, kv_v);
    return attend(q_view, chunk, ao);
  }
  Tensor y(DType::kF32, {1, Hq, T, hd});
  kernels::causal_attention(static_cast<const float*>(q_view.data), static_cast<const float*>(keys.data),
                            static_cast<const float*>(kv_v.data), Hq, Hk, T, hd,
                            1.0f / std::sqrt(static_cast<float>(hd)), y.data_as<float>(), ao.threads);
  return y;
}

// A local layer's prefill: the chunk over the ring's positions and its own,
// each query seeing the last `window` of them.
Tensor window_attention(const KVCache& ring, const TensorView& kv_k, const TensorView& kv_v, const TensorView& q_view,
                        int64_t window, bool reference, int threads) {
  return attention_after_exact(ring, kv_k, kv_v, q_view, window, reference, threads);
}

}  // namespace

// cos/sin rows of a call's positions for one RoPE, computed on first use
// (exact sincos, as rope_rotate_at), shared by every layer with that RoPE.
struct LlamaModel::RopeRows {
  std::vector<float> cos, sin;
  std::pair<const float*, const float*> row(int64_t t, int64_t hd) const {
    return {&cos[static_cast<size_t>(t * (hd / 2))], &sin[static_cast<size_t>(t * (hd / 2))]};
  }
};

struct LlamaModel::Pass {
  int64_t T = 0;
  std::vector<float> x, xn, q, k, v, att, o, gate, up;  // token-major
  std::vector<float> qh, kh, vh, obs_q;                // head-major, as the caches take them
  RopeRows global, local;
  RopeRows& rows_for(bool local_layer) { return local_layer ? local : global; }
};

LlamaModel::LlamaModel(const LlamaWeights& weights, CacheFactory make_cache, int threads, KeyRope keys)
    : w_(weights), threads_(threads), keys_(keys) {
  for (int64_t l = 0; l < w_.config.n_layers; ++l)
    caches_.push_back(w_.config.is_local(l) ? std::make_unique<SlidingWindowKVCache>(w_.config.sliding_window)
                                            : make_cache(l));
}

void LlamaModel::restore(std::vector<std::unique_ptr<KVCache>> caches, int64_t position) {
  constexpr const char* op = "anchorkv::LlamaModel::restore";
  const auto& cfg = w_.config;
  if (static_cast<int64_t>(caches.size()) != cfg.n_layers)
    core::fail(ErrorCode::kInvalidArgument, op,
               std::to_string(caches.size()) + " caches for " + std::to_string(cfg.n_layers) + " layers");
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const KVCache* c = caches[l].get();
    if (!c || c->offset() != position)
      core::fail(ErrorCode::kInvalidArgument, op, "every cache must hold " + std::to_string(position) + " positions");
    const KVCache::Shape s = c->shape();
    if (position > 0 && (s.batch != 1 || s.heads != cfg.n_kv_heads || s.head_dim != cfg.head_dim))
      core::fail(ErrorCode::kInvalidArgument, op,
                 "a cache of batch " + std::to_string(s.batch) + ", " + std::to_string(s.heads) + " heads of dim " +
                     std::to_string(s.head_dim) + " does not fit this model (" + std::to_string(cfg.n_kv_heads) +
                     " KV heads of dim " + std::to_string(cfg.head_dim) + ")");
    const int64_t window = internal::sliding_window(*c);
    if (cfg.is_local(l) != (window > 0) || (window > 0 && window != cfg.sliding_window))
      core::fail(ErrorCode::kInvalidArgument, op,
                 "layer " + std::to_string(l) + "'s cache does not match its attention (local layers take a " +
                     std::to_string(cfg.sliding_window) + "-position window cache, global ones any other)");
  }
  caches_ = std::move(caches);
  pos_ = position;
}

void LlamaModel::mm(const float* x, int64_t T, const Weight& W, float* y) const {
  if (reference_)
    matmul_ref(x, T, W, y, activations_);
  else
    matmul(x, T, W, y, threads_, activations_);
}

std::vector<float> LlamaModel::forward(const std::vector<int32_t>& tokens, bool all_logits) {
  const LlamaConfig& c = w_.config;
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.dim;
  if (T == 0) core::fail(ErrorCode::kInvalidArgument, kForward, "no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab)
      core::fail(ErrorCode::kInvalidArgument, kForward,
                 "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab));
  Pass p;
  p.T = T;
  const size_t q_n = static_cast<size_t>(T * c.n_heads * c.head_dim), kv_n = static_cast<size_t>(T * c.n_kv_heads * c.head_dim);
  p.x.resize(static_cast<size_t>(T * D));
  p.xn.resize(p.x.size());
  p.o.resize(p.x.size());
  p.q.resize(q_n);
  p.att.resize(q_n);
  p.qh.resize(q_n);
  p.k.resize(kv_n);
  p.v.resize(kv_n);
  p.kh.resize(kv_n);
  p.vh.resize(kv_n);
  p.gate.resize(static_cast<size_t>(T * c.hidden));
  p.up.resize(p.gate.size());
  if (observe_ != 0) p.obs_q.resize(q_n);
  for (int64_t t = 0; t < T; ++t) w_.embeddings.row(tokens[t], &p.x[t * D]);
  if (c.embedding_scale != 1.0)
    for (float& e : p.x) e *= static_cast<float>(c.embedding_scale);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    attention_block(l, p);
    ffn_block(l, p);
  }
  std::vector<float> logits = output_logits(p, all_logits);
  pos_ += T;
  return logits;
}

void LlamaModel::attention_block(int64_t l, Pass& p) {
  const LlamaConfig& c = w_.config;
  const LlamaLayer& L = w_.layers[l];
  const int64_t T = p.T, D = c.dim, hd = c.head_dim, Hq = c.n_heads, Hk = c.n_kv_heads;
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rmsnorm(&p.x[t * D], L.attn_norm.data(), D, c.rms_eps, &p.xn[t * D]);
  });
  matmul_shared(p.xn.data(), T, {&L.wq, &L.wk, &L.wv}, {p.q.data(), p.k.data(), p.v.data()}, threads_, activations_,
                reference_);
  add_bias(p.q.data(), T, L.bq);
  add_bias(p.k.data(), T, L.bk);
  add_bias(p.v.data(), T, L.bv);
  if (!L.q_norm.empty())  // per-head norms before RoPE (Qwen3, Gemma 3)
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0 * Hq; i < t1 * Hq; ++i) rmsnorm(&p.q[i * hd], L.q_norm.data(), hd, c.rms_eps, &p.q[i * hd]);
      for (int64_t i = t0 * Hk; i < t1 * Hk; ++i) rmsnorm(&p.k[i * hd], L.k_norm.data(), hd, c.rms_eps, &p.k[i * hd]);
    });
  // A factor on every score (YaRN, Gemma's query scale): on the queries,
  // before RoPE (a rotation commutes with it), so every path sees it.
  if (c.score_factor != 1.0)
    for (float& e : p.q) e *= static_cast<float>(c.score_factor);
  // RoPE at the tokens' positions. Post-RoPE keys (and every local layer,
  // whose ring forgets positions): q and k rotate in place. Pre-RoPE keys:
  // the cache takes k unrotated and attention rotates whenever it reads the
  // cache (decode, or a chunk after earlier tokens); the first chunk and the
  // observer use the rotated copy k_rot.
  const bool local = c.is_local(l), pre = keys_ == KeyRope::kPreRope && !local;
  const bool rope_in_attention = pre && (T == 1 || caches_[l]->offset() > 0);
  const bool rotate = !rope_in_attention || static_cast<bool>(observer_);
  std::vector<float> k_pre, q_rot, k_rot;
  if (observer_) k_pre = p.k;
  if (pre && rotate) {
    q_rot = p.q;
    k_rot = p.k;
  }
  float* qr = pre ? q_rot.data() : p.q.data();
  float* kr = pre ? k_rot.data() : p.k.data();
  if (rotate) rotate_qk(c.rope_of(l), p.rows_for(local), p, qr, kr);
  if (observer_) observer_(l, T, qr, k_pre.data(), kr, p.v.data());
  const Tensor y = attend_layer(l, p, rope_in_attention ? p.q.data() : qr, pre && rotate ? kr : nullptr);
  const float* yp = y.data_as<float>();
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t t = t0; t < t1; ++t) std::copy_n(&yp[(h * T + t) * hd], hd, &p.att[(t * Hq + h) * hd]);
  });
  mm(p.att.data(), T, L.wo, p.o.data());
  add_bias(p.o.data(), T, L.bo);
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (!L.post_attn_norm.empty()) rmsnorm(&p.o[t * D], L.post_attn_norm.data(), D, c.rms_eps, &p.o[t * D]);
      for (int64_t i = t * D; i < (t + 1) * D; ++i) p.x[i] += p.o[i];
    }
  });
}

// RoPE of q and k (token-major) at the call's positions, by `rope`'s rows.
void LlamaModel::rotate_qk(const RopeOptions& rope, RopeRows& rows, const Pass& p, float* q, float* k) const {
  const int64_t T = p.T, hd = w_.config.head_dim, Hq = w_.config.n_heads, Hk = w_.config.n_kv_heads;
  if (rows.cos.empty()) {
    rows.cos.resize(static_cast<size_t>(T * (hd / 2)));
    rows.sin.resize(rows.cos.size());
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        core::rope_table(pos_ + t, 1, hd, rope, &rows.cos[t * (hd / 2)], &rows.sin[t * (hd / 2)]);
    });
  }
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [ct, st] = rows.row(t, hd);
      for (int64_t h = 0; h < Hq; ++h) core::rope_rotate(&q[(t * Hq + h) * hd], hd, rope.style, ct, st);
      for (int64_t h = 0; h < Hk; ++h) core::rope_rotate(&k[(t * Hk + h) * hd], hd, rope.style, ct, st);
    }
  });
}

// The layer's queries `q_att` (token-major, as attention takes them) against
// its cache and the chunk; updates the cache with p.k and p.v (as it stores
// keys: rotated unless pre-RoPE) and the observation queries from p.q (in
// that same domain). k_rot: the rotated keys of a pre-RoPE first chunk.
Tensor LlamaModel::attend_layer(int64_t l, Pass& p, const float* q_att, const float* k_rot) {
  const LlamaConfig& c = w_.config;
  const int64_t T = p.T, hd = c.head_dim, Hq = c.n_heads, Hk = c.n_kv_heads;
  const bool local = c.is_local(l), pre = keys_ == KeyRope::kPreRope && !local;
  KVCache& cache = *caches_[l];
  std::vector<float> k_rot_h(k_rot ? p.kh.size() : 0);
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < Hq; ++h) std::copy_n(&q_att[(t * Hq + h) * hd], hd, &p.qh[(h * T + t) * hd]);
      for (int64_t h = 0; h < Hk; ++h) {
        std::copy_n(&p.k[(t * Hk + h) * hd], hd, &p.kh[(h * T + t) * hd]);
        std::copy_n(&p.v[(t * Hk + h) * hd], hd, &p.vh[(h * T + t) * hd]);
        if (k_rot) std::copy_n(&k_rot[(t * Hk + h) * hd], hd, &k_rot_h[(h * T + t) * hd]);
      }
    }
  });
  const TensorView kv_k = TensorView::f32(p.kh.data(), {1, Hk, T, hd}), kv_v = TensorView::f32(p.vh.data(), {1, Hk, T, hd});
  const TensorView q_view = TensorView::f32(p.qh.data(), {1, Hq, T, hd});
  AttentionOptions ao;
  ao.threads = threads_;
  ao.reference = reference_;
  ao.bf16_residuals = ao.bf16_scores = bf16_arithmetic_;
  if (pre && (T == 1 || cache.offset() > 0)) ao.rope = c.rope;  // cache position 0 is token position 0
  // Caches that observe a window score the prompt only: a decode step's one
  // query goes to them only when every position is asked for (H2O) or the
  // caches stream (observe_steps_: they score the segments decode closes). Queries
  // are as the cache stores keys: rotated for post-RoPE keys, not for pre-RoPE.
  const int64_t W = local ? 0 : observe_ < 0 ? T : T > 1 || observe_steps_ ? std::min(observe_, T) : 0;
  for (int64_t h = 0; h < Hq && W > 0; ++h)
    for (int64_t j = 0; j < W; ++j)
      std::copy_n(&p.q[((T - W + j) * Hq + h) * hd], hd, &p.obs_q[(h * W + j) * hd]);
  auto update_cache = [&] {
    if (W > 0)
      cache.update(kv_k, kv_v, TensorView::f32(p.obs_q.data(), {1, Hq, W, hd}));
    else
      cache.update(kv_k, kv_v);
  };
  Tensor y;
  if (T > 1 && local) {
    y = window_attention(cache, kv_k, kv_v, q_view, c.sliding_window, reference_, threads_);
    update_cache();
  } else if (T > 1) {
    y = prefill_attention(cache, k_rot ? k_rot_h.data() : nullptr, kv_k, kv_v, q_view, ao);
    update_cache();
  } else {
    update_cache();
    y = attend(q_view, cache, ao);
  }
  return y;
}

void LlamaModel::ffn_block(int64_t l, Pass& p) {
  const LlamaConfig& c = w_.config;
  const LlamaLayer& L = w_.layers[l];
  const int64_t T = p.T, D = c.dim, H = c.hidden;
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rmsnorm(&p.x[t * D], L.ffn_norm.data(), D, c.rms_eps, &p.xn[t * D]);
  });
  matmul_shared(p.xn.data(), T, {&L.w_gate, &L.w_up}, {p.gate.data(), p.up.data()}, threads_, activations_,
                reference_);
  add_bias(p.gate.data(), T, L.b_gate);
  add_bias(p.up.data(), T, L.b_up);
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    float* g = &p.gate[static_cast<size_t>(t0 * H)];
    const float* u = &p.up[static_cast<size_t>(t0 * H)];
    if (c.ffn == LlamaConfig::Ffn::kGeGluTanh)
      core::geglu_tanh(g, u, (t1 - t0) * H);
    else if (reference_)
      core::swiglu_ref(g, u, (t1 - t0) * H);
    else
      core::swiglu(g, u, (t1 - t0) * H);
  });
  mm(p.gate.data(), T, L.w_down, p.o.data());
  add_bias(p.o.data(), T, L.b_down);
  for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (!L.post_ffn_norm.empty()) rmsnorm(&p.o[t * D], L.post_ffn_norm.data(), D, c.rms_eps, &p.o[t * D]);
      for (int64_t i = t * D; i < (t + 1) * D; ++i) p.x[i] += p.o[i];
    }
  });
}

std::vector<float> LlamaModel::output_logits(Pass& p, bool all_logits) {
  const LlamaConfig& c = w_.config;
  const int64_t T = p.T, D = c.dim, first = all_logits ? 0 : T - 1, n = T - first;
  for (int64_t t = first; t < T; ++t) rmsnorm(&p.x[t * D], w_.final_norm.data(), D, c.rms_eps, &p.xn[(t - first) * D]);
  std::vector<float> logits(static_cast<size_t>(n * c.vocab));
  mm(p.xn.data(), n, w_.output(), logits.data());
  add_bias(logits.data(), n, w_.output_bias);
  if (c.final_softcap > 0)
    for (float& z : logits) z = static_cast<float>(c.final_softcap * std::tanh(z / c.final_softcap));
  return logits;
}

}  // namespace anchorkv::model
