// Attention over a KV cache, without ever building the dense K/V of a
// compressed cache (the paper's fused kernel, on CPU).
//
// attend(query, cache, options) -> output
//   query  [B, Hq, Sq, D] (f32, f16 or bf16, any strides); Hq a multiple of the
//          cache's H (GQA / MQA: query head hq reads KV head hq / (Hq / H)).
//          The Sq queries are the cache's last Sq positions (update the cache
//          with their K/V first): query i sits at position offset - Sq + i and
//          attends causally to every position up to and including its own.
//   output [B, Hq, Sq, D], f32 (or f16 with options.out_dtype).
// Caches that evict tokens are attended over what they keep, with causal
// positions taken as the kept tokens' order (decode queries see them all);
// RoPE inside attention is refused for them (it needs true positions).
// Works on any KVCache: AnchorKVCache runs the compressed kernel (anchors +
// coefficients + rotated-domain residuals + exact tokens, one online
// softmax); FullKVCache runs the dense fp16 kernel; any other cache is
// fetched dense and runs the dense kernel. Results are bit-identical for any
// thread count. Throws anchorkv::Error on bad shapes, non-finite queries or an
// empty cache; the cache is never modified.
#pragma once

#include <vector>

#include "anchorkv/cache.h"
#include "anchorkv/tensor.h"

namespace anchorkv {

struct AttentionOptions {
  RopeOptions rope;               // off: keys and query are used as given (post-RoPE)
  float scale = 0.0f;             // softmax scale; 0 means 1 / sqrt(D)
  DType out_dtype = DType::kF32;  // kF32 or kF16
  int threads = 0;                // 0 = all cores
  bool reference = false;         // run the scalar reference kernels (for tests and checks)
  // 2-bit AnchorKV residuals scored and summed with bf16 products (fp32
  // sums) where the CPU has AVX-512 BF16: the rotated query and each value
  // weight rounded to bf16 (docs/spec.md §6). false: fp32 throughout.
  bool bf16_residuals = true;
  // Pre-RoPE anchor scores (keys stored before RoPE) with bf16 products
  // (fp32 sums) where the CPU has AVX-512 BF16: each entry's key, rotated to
  // its position in fp32, and the queries rounded to bf16 (docs/spec.md §6).
  // false: fp32. The scalar twin (reference) always scores in fp32.
  bool bf16_scores = true;
};

// What one attend() call used besides its output.
struct AttentionStats {
  int64_t workspace_bytes = 0;  // every buffer attend allocated (queries, partials, per-row prep,
                                // per-thread scratch); never the dense K/V of a compressed segment
  int64_t chunks_per_row = 0;   // work items per (batch, KV head) row
  bool compressed = false;      // the compressed kernel ran
};

Tensor attend(const TensorView& query, const KVCache& cache, const AttentionOptions& options = {},
              AttentionStats* stats = nullptr);

// Attention over the positions of several caches one after the other (the
// first cache's positions, then the second's, ...), e.g. a compressed prefix
// followed by a prefill chunk held exactly: nothing is densified. Only the
// first cache may hold a compressed segment; B, H and D must agree. Empty
// caches are skipped.
Tensor attend(const TensorView& query, const std::vector<const KVCache*>& caches,
              const AttentionOptions& options = {}, AttentionStats* stats = nullptr);

}  // namespace anchorkv
