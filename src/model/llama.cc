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

void matmul_shared(const float* x, int64_t T, const std::vector<const Weight*>& Ws, const std::vector<float*>& ys,
                   int threads, Activations activations, bool reference) {
  bool batch = !reference;
  for (const Weight* W : Ws) batch = batch && integer_path(*W, T, activations);
  if (!batch) {
    for (size_t i = 0; i < Ws.size(); ++i) {
      if (reference)
        matmul_ref(x, T, *Ws[i], ys[i], activations);
      else
        matmul(x, T, *Ws[i], ys[i], threads, activations);
    }
    return;
  }
  std::vector<QuantMatrix> qm;
  for (const Weight* W : Ws) qm.push_back(quant_matrix(*W));
  matmul_int8_batch(x, T, qm.data(), ys.data(), static_cast<int>(qm.size()), threads);
}

}  // namespace anchorkv::model
