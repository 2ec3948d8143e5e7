// A small random Llama model for the fuzz targets that run the runtime
// (restore_fuzz, chain_fuzz): two layers, head dim 16, a vocabulary of 24.
#pragma once

#include <vector>

#include "core/rng.h"
#include "model/llama.h"

namespace anchorkv::fuzz {

inline model::LlamaWeights tiny_weights() {
  model::LlamaWeights w;
  model::LlamaConfig& c = w.config;
  c.architecture = "llama";
  c.dim = 32, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 16, c.hidden = 48, c.vocab = 24;
  c.context = 256;
  core::Rng rng(7);
  auto mat = [&](int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = 0.4f * static_cast<float>(rng.uniform() - 0.5);
    return model::Weight::from_f32(std::move(v), rows, cols);
  };
  w.embeddings = mat(c.vocab, c.dim);
  w.final_norm.assign(static_cast<size_t>(c.dim), 1.0f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    model::LlamaLayer L;
    L.attn_norm.assign(static_cast<size_t>(c.dim), 1.0f);
    L.ffn_norm = L.attn_norm;
    L.wq = mat(c.n_heads * c.head_dim, c.dim);
    L.wk = mat(c.n_kv_heads * c.head_dim, c.dim);
    L.wv = mat(c.n_kv_heads * c.head_dim, c.dim);
    L.wo = mat(c.dim, c.n_heads * c.head_dim);
    L.w_gate = mat(c.hidden, c.dim);
    L.w_up = mat(c.hidden, c.dim);
    L.w_down = mat(c.dim, c.hidden);
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace anchorkv::fuzz
