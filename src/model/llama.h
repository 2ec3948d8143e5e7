// A compact Llama-family runtime: weights from GGUF (architecture `llama`) or
// a llama2.c checkpoint, a forward pass whose every layer reads and writes any
// KVCache (attention through attend(), so compressed caches are never
// densified during decode). Keys enter the cache after RoPE (as the seed) or
// before it (KeyRope::kPreRope, as the paper). A multi-token chunk (prefill)
// attends over exact K/V, and the cache compresses or evicts afterwards for
// the decode steps.
//
// Architectures: `llama` and `mistral` (RoPE on adjacent pairs, as GGUF stores
// them), `qwen2` (Q/K/V biases, NeoX pairing: i with i + hd/2), llama2.c
// checkpoints; with the optional biases, fused QKV and RoPE scaling
// (rope_freqs, linear, YaRN) llama.cpp applies to them (gguf_loader.cc). Weight matrices stay in their file type (F16, Q8_0, Q4_K, ...:
// any type dequantize_row reads), so memory and decode bandwidth are those of
// the file: decode multiplies Q4_0/Q8_0/Q4_K/Q5_K/Q6_K blocks with 8-bit
// activations in integers, prefill dequantizes tile by tile (see
// Activations); norms and biases are f32.
//
// Shapes (row-major): embeddings [vocab, dim]; wq [n_heads*hd, dim];
// wk, wv [n_kv*hd, dim]; wo [dim, n_heads*hd]; w_gate, w_up [hidden, dim];
// w_down [dim, hidden]; output [vocab, dim].
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "anchorkv/attention.h"
#include "anchorkv/cache.h"
#include "core/buffer.h"
#include "io/gguf.h"
#include "model/qmatmul.h"

namespace anchorkv::io {
class GgufFile;
}

namespace anchorkv::model {

struct LlamaConfig {
  int64_t dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, hidden = 0, vocab = 0;
  int64_t context = 0;
  // How the model turns queries and keys: base, pairing and the per-pair
  // frequency scales of its RoPE scaling (position_offset 0: cache position 0
  // is token position 0).
  RopeOptions rope{true, 10000.0, RopeStyle::kNormal, 0, {}};
  // Every q.k score is multiplied by this (YaRN's magnitude scale squared,
  // Gemma's query scale relative to 1/sqrt(head_dim); 1 otherwise), applied
  // to the queries.
  double score_factor = 1.0;
  double rms_eps = 1e-5;
  std::string architecture;
  enum class Ffn : uint8_t { kSwiGlu, kGeGluTanh };
  Ffn ffn = Ffn::kSwiGlu;
  double embedding_scale = 1.0;  // token embeddings times this (Gemma: sqrt(dim))
  double final_softcap = 0.0;    // > 0: logits -> cap * tanh(logits / cap)
  // Sliding-window ("local") layers attend only the last `sliding_window`
  // positions, with RoPE `rope_local`; the others are global. A local layer's
  // cache is a SlidingWindowKVCache whatever cache the model is given.
  int64_t sliding_window = 0;
  std::vector<uint8_t> local_layers;  // per layer, 1 for local; empty: none
  RopeOptions rope_local{true, 10000.0, RopeStyle::kNormal, 0, {}};
  bool is_local(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(local_layers.size()) && local_layers[layer];
  }
  const RopeOptions& rope_of(int64_t layer) const { return is_local(layer) ? rope_local : rope; }
};

// A weight matrix [rows, cols] (row-major: a row's cols are contiguous) in its
// file type: F32 as floats, any other GGML type as its blocks, row after row
// as in the file, except Q8_0, Q4_0, Q4_K and Q5_K on CPUs with AVX-512 VNNI:
// rearranged into groups of 16 rows (QuantLayout::kRows16, lossless), the
// layout their one-token kernels read fastest.
struct Weight {
  io::GgmlType type = io::GgmlType::kF32;
  int64_t rows = 0, cols = 0;
  QuantLayout layout = QuantLayout::kGguf;
  std::vector<float> f32;               // type F32: rows * cols
  core::AlignedVector<uint8_t> blocks;  // other types: rows * row_bytes(), or rows16_bytes
  static Weight from_f32(std::vector<float> data, int64_t rows, int64_t cols);
  int64_t row_bytes() const;
  void row(int64_t r, float* out) const;  // row r as floats [cols]
  int64_t bytes() const { return static_cast<int64_t>(f32.size() * 4 + blocks.size()); }
};

struct LlamaLayer {
  std::vector<float> attn_norm, ffn_norm;
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;
  // Biases added after their matmuls; each empty when the file has none.
  std::vector<float> bq, bk, bv, bo, b_gate, b_up, b_down;
  // Optional norms (empty when absent): RMSNorm of each query and key head
  // before RoPE [head_dim] (Qwen3, Gemma 3), of the attention output and of
  // the FFN output before they join the residual [dim] (Gemma 3).
  std::vector<float> q_norm, k_norm, post_attn_norm, post_ffn_norm;
};

struct LlamaWeights {
  LlamaConfig config;
  Weight embeddings;  // [vocab, dim]
  std::vector<float> final_norm;
  Weight output_weight;  // [vocab, dim]; empty when tied to the embeddings
  std::vector<float> output_bias;  // [vocab] or empty
  std::vector<LlamaLayer> layers;
  const Weight& output() const { return output_weight.rows > 0 ? output_weight : embeddings; }
  int64_t bytes() const;  // every weight as held in memory
};

// Throws Error(kCorruptFile / kUnsupported / kIo) naming what is wrong; a
// tensor or key that would change the result and that this runtime does not
// apply is kUnsupported, naming it (gguf_loader.cc).
LlamaWeights load_gguf(const std::string& path);
// From an opened file (`name` for messages): tests and fuzzing load from memory.
LlamaWeights load_gguf(const io::GgufFile& file, const std::string& name);
LlamaWeights load_llama2c(const std::string& path);
// By extension: .gguf -> GGUF, otherwise llama2.c.
LlamaWeights load_model(const std::string& path);

// One cache per layer, made by `make_cache(layer)`.
using CacheFactory = std::function<std::unique_ptr<KVCache>(int64_t layer)>;

// Where keys enter the cache: after RoPE (the seed's setting: the cache holds
// rotated keys) or before it (the paper's, §3.2: the cache holds unrotated
// keys, and attention rotates the query and every key at its position). A
// cache that evicts tokens loses their positions, so it needs kPostRope.
enum class KeyRope : uint8_t { kPostRope, kPreRope };

// What multiplies quantized weights (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) in decode
// (up to 7 tokens per call): the activations quantized to 8 bits per group and
// integer dot products (model/qmatmul.h; llama.cpp's way and the default), or
// f32 activations and the weights dequantized to f32 (exact up to f32
// rounding, 2-4x slower per token). Prefill chunks and other weight types
// always take the f32 path: there one dequantized tile serves every token.
enum class Activations : uint8_t { kInt8, kF32 };

class LlamaModel {
 public:
  LlamaModel(const LlamaWeights& weights, CacheFactory make_cache, int threads = 0,
             KeyRope keys = KeyRope::kPostRope);
  // Feeds tokens at the next positions; returns logits [tokens, vocab] when
  // all_logits, else [1, vocab] for the last token.
  std::vector<float> forward(const std::vector<int32_t>& tokens, bool all_logits = false);
  int64_t position() const { return pos_; }
  // Continues from saved caches (one per layer, each holding `position`
  // positions, keys stored as this model stores them). Throws
  // Error(kInvalidArgument) and changes nothing if they do not fit.
  void restore(std::vector<std::unique_ptr<KVCache>> caches, int64_t position);
  KeyRope keys() const { return keys_; }
  const LlamaConfig& config() const { return w_.config; }
  const std::vector<std::unique_ptr<KVCache>>& caches() const { return caches_; }

  // Called per layer during forward with [T, heads, head_dim] token-major
  // arrays: queries and keys after RoPE, keys before RoPE, values.
  using LayerObserver = std::function<void(int64_t layer, int64_t T, const float* q, const float* k_pre,
                                           const float* k_post, const float* v)>;
  void set_observer(LayerObserver f) { observer_ = std::move(f); }
  // Scalar reference kernels for every matmul and attention (tests compare the
  // fast path with it).
  void set_reference(bool on) { reference_ = on; }
  // AttentionOptions::bf16_residuals and bf16_scores for every attend() (the runtime's :fp32 turns them off).
  void set_bf16_arithmetic(bool on) { bf16_arithmetic_ = on; }
  void set_activations(Activations a) { activations_ = a; }
  Activations activations() const { return activations_; }
  // Observation queries handed to every layer's cache with each update
  // (KVCache::update with queries; in the stored keys' RoPE domain): the
  // queries of the last `n` positions of each prefill chunk (n < 0: every
  // position of every call, decode steps included; 0: none, the default, and
  // the seed's behaviour). every_step: decode steps hand over their one query
  // too (a streaming cache scores the segments it closes during decode).
  void set_observation_window(int64_t n, bool every_step = false) {
    observe_ = n;
    observe_steps_ = every_step;
  }
  int64_t observation_window() const { return observe_; }

 private:
  struct Pass;      // one forward call's activations (llama_model.cc)
  struct RopeRows;  // one call's cos/sin rows for one RoPE
  void attention_block(int64_t layer, Pass& p);
  void ffn_block(int64_t layer, Pass& p);
  void rotate_qk(const RopeOptions& rope, RopeRows& rows, const Pass& p, float* q, float* k) const;
  Tensor attend_layer(int64_t layer, Pass& p, const float* q_att, const float* k_rot);
  std::vector<float> output_logits(Pass& p, bool all_logits);
  void mm(const float* x, int64_t T, const Weight& W, float* y) const;

  LayerObserver observer_;
  const LlamaWeights& w_;
  std::vector<std::unique_ptr<KVCache>> caches_;
  int threads_;
  KeyRope keys_;
  bool reference_ = false;
  bool bf16_arithmetic_ = true;
  Activations activations_ = Activations::kInt8;
  int64_t observe_ = 0;
  bool observe_steps_ = false;
  int64_t pos_ = 0;
};

// y[t, o] = sum_i W[o, i] x[t, i]; x [T, in], W [out, in], y [T, out]. Threads
// split the output rows (same bits for any thread count). With kInt8 and at
// most 7 tokens, weights of a type the integer kernels take go through
// matmul_int8; otherwise quantized rows are dequantized per tile of rows, once
// for all T inputs.
void matmul(const float* x, int64_t T, const Weight& W, float* y, int threads,
            Activations activations = Activations::kInt8);
// The same with scalar loops (reference; matmul_int8_ref for the integer path).
void matmul_ref(const float* x, int64_t T, const Weight& W, float* y,
                Activations activations = Activations::kInt8);
// y_i = W_i x for matrices that share their input (Q, K, V; gate, up): one
// integer batch (one activation quantization, one synchronization) when all
// take the integer path, else one matmul each (matmul_ref with `reference`).
void matmul_shared(const float* x, int64_t T, const std::vector<const Weight*>& Ws, const std::vector<float*>& ys,
                   int threads, Activations activations, bool reference);

}  // namespace anchorkv::model
