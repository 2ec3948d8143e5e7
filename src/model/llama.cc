#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/rope.h"
#include "io/gguf.h"
#include "kernels/causal_attention.h"
#include "model/amx_matmul.h"
#include "model/qmatmul.h"

namespace anchorkv::model {

Weight Weight::from_f32(std::vector<float> data, int64_t rows, int64_t cols) {
  Weight w;
  w.rows = rows;
  w.cols = cols;
  w.f32 = std::move(data);
  return w;
}

int64_t Weight::row_bytes() const {
  int64_t be = 1, bb = 4;
  io::ggml_block(type, &be, &bb);
  return cols / be * bb;
}

void Weight::row(int64_t r, float* out) const {
  if (type == io::GgmlType::kF32)
    std::copy_n(&f32[static_cast<size_t>(r * cols)], cols, out);
  else if (layout == QuantLayout::kRows16)
    dequantize_rows16_row(type, blocks.data(), cols, r, out);
  else
    io::dequantize_row(type, &blocks[static_cast<size_t>(r * row_bytes())], cols, out);
}

int64_t LlamaWeights::bytes() const {
  int64_t b = embeddings.bytes() + output_weight.bytes() +
              static_cast<int64_t>(final_norm.size() + output_bias.size()) * 4;
  for (const auto& L : layers) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() + L.w_up.bytes() +
         L.w_down.bytes();
    for (const auto* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.b_gate, &L.b_up, &L.b_down})
      b += static_cast<int64_t>(v->size()) * 4;
  }
  return b;
}

namespace {
// Integer sums are converted and scaled per 32-element block and token; a
// dequantized f32 tile is shared by every token of a chunk instead, so from
// this many tokens on the f32 FMAs win (measured crossover: 8 tokens, Q8_0
// 2816x1024, two threads).
constexpr int64_t kInt8MaxTokens = 7;

// On AMX every token count takes the integer path (tiles from kAmxMinTokens
// on), and so do weights in groups of 16 rows: their VNNI kernels multiply
// four tokens per pass at 64 products per instruction, 2.9x the f32 tiles in
// a 512-token prefill without AMX (2500 vs 870 tok/s, synthetic Q8_0 model).
bool integer_path(const Weight& W, int64_t T, Activations activations) {
  return activations == Activations::kInt8 && int8_matmul_supported(W.type) &&
         (T <= kInt8MaxTokens || amx_matmul_usable(W.type) || W.layout == QuantLayout::kRows16);
}
QuantMatrix quant_matrix(const Weight& W) {
  return {W.type, W.blocks.data(), W.rows, W.cols, W.row_bytes(), W.layout};
}
}  // namespace

void matmul(const float* x, int64_t T, const Weight& W, float* y, int threads, Activations activations) {
  if (integer_path(W, T, activations)) return matmul_int8(x, T, quant_matrix(W), y, threads);
  const int64_t in = W.cols, out = W.rows;
  if (W.type == io::GgmlType::kF32) {
    constexpr int64_t kRows = 64;
    core::parallel_for((out + kRows - 1) / kRows, threads, [&](int64_t t) {
      const int64_t o0 = t * kRows, n = std::min(kRows, out - o0);
      core::dot_matrix(x, T, in, W.f32.data() + o0 * in, n, in, in, y + o0, out);
    });
    return;
  }
  // Quantized rows: dequantize a tile of rows into a per-thread buffer (L2-sized),
  // then the same SIMD kernel as for f32 weights.
  const int64_t rows_per_tile = std::clamp<int64_t>((int64_t{64} << 10) / std::max<int64_t>(in, 1), 1, 64);
  core::parallel_for((out + rows_per_tile - 1) / rows_per_tile, threads, [&](int64_t t) {
    thread_local std::vector<float> tile;
    const int64_t o0 = t * rows_per_tile, n = std::min(rows_per_tile, out - o0);
    tile.resize(static_cast<size_t>(n * in));
    for (int64_t r = 0; r < n; ++r) W.row(o0 + r, &tile[static_cast<size_t>(r * in)]);
    core::dot_matrix(x, T, in, tile.data(), n, in, in, y + o0, out);
  });
}

void matmul_ref(const float* x, int64_t T, const Weight& W, float* y, Activations activations) {
  if (integer_path(W, T, activations)) return matmul_int8_ref(x, T, quant_matrix(W), y);
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t o = 0; o < W.rows; ++o) {
    W.row(o, row.data());
    core::dot_matrix_ref(x, T, W.cols, row.data(), 1, W.cols, W.cols, y + o, W.rows);
  }
}

std::unique_ptr<KVCache> with_key_rope(std::unique_ptr<KVCache> cache, const LlamaConfig& c) {
  const auto* a = dynamic_cast<const AnchorKVCache*>(cache.get());
  if (!a || a->config().key_rope.enabled || a->tokens_total() > 0) return cache;
  AnchorKVConfig cfg = a->config();
  cfg.key_rope = c.rope;  // cache position 0 is token position 0
  return std::make_unique<AnchorKVCache>(cfg);
}

LlamaModel::LlamaModel(const LlamaWeights& weights, CacheFactory make_cache, int threads, KeyRope keys)
    : w_(weights), threads_(threads), keys_(keys) {
  for (int64_t l = 0; l < w_.config.n_layers; ++l) caches_.push_back(make_cache(l));
}

void LlamaModel::restore(std::vector<std::unique_ptr<KVCache>> caches, int64_t position) {
  constexpr const char* op = "anchorkv::LlamaModel::restore";
  if (static_cast<int64_t>(caches.size()) != w_.config.n_layers)
    core::fail(
        ErrorCode::kInvalidArgument, op,
        std::to_string(caches.size()) + " caches for " + std::to_string(w_.config.n_layers) + " layers");
  const auto& cfg = w_.config;
  for (const auto& c : caches) {
    if (!c || c->offset() != position)
      core::fail(ErrorCode::kInvalidArgument, op,
                 "every cache must hold " + std::to_string(position) + " positions");
    const KVCache::Shape s = c->shape();
    if (position > 0 && (s.batch != 1 || s.heads != cfg.n_kv_heads || s.head_dim != cfg.head_dim))
      core::fail(ErrorCode::kInvalidArgument, op,
                 "a cache of batch " + std::to_string(s.batch) + ", " + std::to_string(s.heads) +
                     " heads of dim " + std::to_string(s.head_dim) + " does not fit this model (" +
                     std::to_string(cfg.n_kv_heads) + " KV heads of dim " + std::to_string(cfg.head_dim) + ")");
  }
  caches_ = std::move(caches);
  pos_ = position;
}

namespace {
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
}  // namespace

namespace {

// A prefill chunk attends over what the cache held before it — read as
// stored, never densified — followed by the chunk itself held exactly; the
// cache compresses or evicts the chunk afterwards (the paper compresses "at the
// end of prefill"; SnapKV/H2O score then evict). For the first chunk (an empty
// cache) pre-RoPE keys arrive rotated (`k_rot`, token-major [T, Hk, hd]) and
// attention needs no RoPE; otherwise the chunk is stored like the cache's
// keys and `ao` carries the RoPE of pre-RoPE caches.
Tensor prefill_attention(const KVCache& cache, bool pre, const float* k_rot, int64_t T, int64_t Hk,
                         int64_t hd, const TensorView& kv_k, const TensorView& kv_v, const TensorView& q_view,
                         const AttentionOptions& ao) {
  FullKVCache chunk;
  if (cache.offset() > 0) {
    chunk.update(kv_k, kv_v);
    return attend(q_view, {&cache, &chunk}, ao);
  }
  // The chunk's keys as attention sees them, head-major: pre-RoPE keys from
  // their rotated copies.
  std::vector<float> rotated;
  TensorView keys = kv_k;
  if (pre) {
    rotated.resize(static_cast<size_t>(T * Hk * hd));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hk; ++h) std::copy_n(&k_rot[(t * Hk + h) * hd], hd, &rotated[(h * T + t) * hd]);
    keys = TensorView::f32(rotated.data(), {1, Hk, T, hd});
  }
  if (ao.reference || ao.scale != 0.0f) {  // attend() over the chunk: the reference
    chunk.update(keys, kv_v);
    return attend(q_view, chunk, ao);
  }
  const int64_t Hq = q_view.shape[1];
  Tensor y(DType::kF32, {1, Hq, T, hd});
  kernels::causal_attention(static_cast<const float*>(q_view.data), static_cast<const float*>(keys.data),
                            static_cast<const float*>(kv_v.data), Hq, Hk, T, hd,
                            1.0f / std::sqrt(static_cast<float>(hd)), y.data_as<float>(), ao.threads);
  return y;
}

}  // namespace

std::vector<float> LlamaModel::forward(const std::vector<int32_t>& tokens, bool all_logits) {
  const LlamaConfig& c = w_.config;
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.dim, hd = c.head_dim, Hq = c.n_heads,
                Hk = c.n_kv_heads;
  if (T == 0) core::fail(ErrorCode::kInvalidArgument, "anchorkv::LlamaModel::forward", "no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab)
      core::fail(
          ErrorCode::kInvalidArgument, "anchorkv::LlamaModel::forward",
          "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab));
  std::vector<float> x(static_cast<size_t>(T * D)), xn(x.size()), q(static_cast<size_t>(T * Hq * hd)),
      k(static_cast<size_t>(T * Hk * hd)), v(k.size()), att(q.size()), o(x.size()),
      gate(static_cast<size_t>(T * c.hidden)), up(gate.size());
  for (int64_t t = 0; t < T; ++t) w_.embeddings.row(tokens[t], &x[t * D]);
  auto mm = [&](const float* x_, int64_t T_, const Weight& W, float* y_) {
    if (reference_)
      matmul_ref(x_, T_, W, y_, activations_);
    else
      matmul(x_, T_, W, y_, threads_, activations_);
  };
  // Matrices that share their input (Q, K, V; gate, up): one integer batch
  // (one activation quantization, one synchronization) when all take the
  // integer path, else one matmul each.
  auto mm_shared = [&](const float* x_, int64_t T_, std::vector<const Weight*> Ws, std::vector<float*> ys) {
    bool batch = !reference_;
    for (const Weight* W : Ws) batch = batch && integer_path(*W, T_, activations_);
    if (!batch) {
      for (size_t i = 0; i < Ws.size(); ++i) mm(x_, T_, *Ws[i], ys[i]);
      return;
    }
    std::vector<QuantMatrix> qm;
    for (const Weight* W : Ws) qm.push_back(quant_matrix(*W));
    matmul_int8_batch(x_, T_, qm.data(), ys.data(), static_cast<int>(qm.size()), threads_);
  };
  const RopeOptions& rope = c.rope;
  std::vector<float> qh(q.size()), kh(k.size()), vh(v.size()), obs_q(observe_ != 0 ? q.size() : 0);
  // One cos/sin row per position (exact sincos, as rope_rotate_at), shared by
  // every head and layer: computed lazily, by the first layer that rotates.
  std::vector<float> rope_cos, rope_sin;
  auto rope_rows = [&] {
    if (!rope_cos.empty()) return;
    rope_cos.resize(static_cast<size_t>(T * (hd / 2)));
    rope_sin.resize(rope_cos.size());
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        core::rope_table(pos_ + t, 1, hd, rope, &rope_cos[t * (hd / 2)], &rope_sin[t * (hd / 2)]);
    });
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LlamaLayer& L = w_.layers[l];
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) rmsnorm(&x[t * D], L.attn_norm.data(), D, c.rms_eps, &xn[t * D]);
    });
    mm_shared(xn.data(), T, {&L.wq, &L.wk, &L.wv}, {q.data(), k.data(), v.data()});
    add_bias(q.data(), T, L.bq);
    add_bias(k.data(), T, L.bk);
    add_bias(v.data(), T, L.bv);
    // A factor on every score (YaRN): on the queries, before RoPE (a rotation
    // commutes with it), so every attention path and observer sees it.
    if (c.score_factor != 1.0)
      for (float& x : q) x *= static_cast<float>(c.score_factor);
    // RoPE at the tokens' positions. Post-RoPE keys: q and k are rotated in
    // place and the cache stores rotated keys. Pre-RoPE keys: the cache stores
    // k unrotated and attention rotates whenever it reads the cache (decode, or
    // a chunk after earlier tokens); the first chunk (and the observer) use
    // rotated copies.
    const bool pre = keys_ == KeyRope::kPreRope;
    KVCache& cache = *caches_[l];
    const bool rope_in_attention = pre && (T == 1 || cache.offset() > 0);
    const bool rotate = !rope_in_attention || static_cast<bool>(observer_);
    std::vector<float> k_pre, q_rot, k_rot;
    if (observer_) k_pre = k;
    if (pre && rotate) {
      q_rot = q;
      k_rot = k;
    }
    float* qr = pre ? q_rot.data() : q.data();
    float* kr = pre ? k_rot.data() : k.data();
    if (rotate) {
      rope_rows();
      for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float *c_t = &rope_cos[t * (hd / 2)], *s_t = &rope_sin[t * (hd / 2)];
          for (int64_t h = 0; h < Hq; ++h)
            core::rope_rotate(&qr[(t * Hq + h) * hd], hd, rope.style, c_t, s_t);
          for (int64_t h = 0; h < Hk; ++h)
            core::rope_rotate(&kr[(t * Hk + h) * hd], hd, rope.style, c_t, s_t);
        }
      });
    }
    if (observer_) observer_(l, T, qr, k_pre.data(), kr, v.data());
    // [T, H, hd] token-major -> [1, H, T, hd] head-major.
    const float* q_att = rope_in_attention ? q.data() : qr;
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t h = 0; h < Hq; ++h) std::copy_n(&q_att[(t * Hq + h) * hd], hd, &qh[(h * T + t) * hd]);
        for (int64_t h = 0; h < Hk; ++h) {
          std::copy_n(&k[(t * Hk + h) * hd], hd, &kh[(h * T + t) * hd]);
          std::copy_n(&v[(t * Hk + h) * hd], hd, &vh[(h * T + t) * hd]);
        }
      }
    });
    const TensorView kv_k = TensorView::f32(kh.data(), {1, Hk, T, hd}),
                     kv_v = TensorView::f32(vh.data(), {1, Hk, T, hd});
    const TensorView q_view = TensorView::f32(qh.data(), {1, Hq, T, hd});
    AttentionOptions ao;
    ao.threads = threads_;
    ao.reference = reference_;
    if (rope_in_attention) ao.rope = rope;  // cache position 0 is token position 0
    // The queries of the call's last W positions, head-major, as the cache
    // stores keys: `q` is rotated in place for post-RoPE keys and left
    // unrotated for pre-RoPE ones.
    // Caches that observe a window score the prompt only: a decode step's one
    // query goes to them only when every position is asked for (H2O).
    const int64_t W = observe_ < 0 ? T : T > 1 ? std::min(observe_, T) : 0;
    for (int64_t h = 0; h < Hq && W > 0; ++h)
      for (int64_t j = 0; j < W; ++j) std::copy_n(&q[((T - W + j) * Hq + h) * hd], hd, &obs_q[(h * W + j) * hd]);
    auto update_cache = [&] {
      if (W > 0)
        cache.update(kv_k, kv_v, TensorView::f32(obs_q.data(), {1, Hq, W, hd}));
      else
        cache.update(kv_k, kv_v);
    };
    Tensor y;
    if (T > 1) {
      y = prefill_attention(cache, pre, kr, T, Hk, hd, kv_k, kv_v, q_view, ao);
      update_cache();
    } else {
      update_cache();
      y = attend(q_view, cache, ao);
    }
    const float* yp = y.data_as<float>();
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t t = t0; t < t1; ++t) std::copy_n(&yp[(h * T + t) * hd], hd, &att[(t * Hq + h) * hd]);
    });
    mm(att.data(), T, L.wo, o.data());
    add_bias(o.data(), T, L.bo);
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0 * D; i < t1 * D; ++i) x[i] += o[i];
      for (int64_t t = t0; t < t1; ++t) rmsnorm(&x[t * D], L.ffn_norm.data(), D, c.rms_eps, &xn[t * D]);
    });
    mm_shared(xn.data(), T, {&L.w_gate, &L.w_up}, {gate.data(), up.data()});
    add_bias(gate.data(), T, L.b_gate);
    add_bias(up.data(), T, L.b_up);
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      float* g = &gate[static_cast<size_t>(t0 * c.hidden)];
      const float* u = &up[static_cast<size_t>(t0 * c.hidden)];
      if (reference_)
        core::swiglu_ref(g, u, (t1 - t0) * c.hidden);
      else
        core::swiglu(g, u, (t1 - t0) * c.hidden);
    });
    mm(gate.data(), T, L.w_down, o.data());
    add_bias(o.data(), T, L.b_down);
    for_tokens(T, threads_, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0 * D; i < t1 * D; ++i) x[i] += o[i];
    });
  }
  const int64_t first = all_logits ? 0 : T - 1, n = T - first;
  for (int64_t t = first; t < T; ++t)
    rmsnorm(&x[t * D], w_.final_norm.data(), D, c.rms_eps, &xn[(t - first) * D]);
  std::vector<float> logits(static_cast<size_t>(n * c.vocab));
  mm(xn.data(), n, w_.output(), logits.data());
  add_bias(logits.data(), n, w_.output_bias);
  pos_ += T;
  return logits;
}

}  // namespace anchorkv::model
