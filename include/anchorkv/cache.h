// KV caches. One cache object holds one transformer layer's K/V for a batch.
//
// update_and_fetch(keys, values): keys/values are [B, H, S, D] views of the
// same shape (f32, f16 or bf16); B, H, D must match earlier calls. Returns the
// dense fp16 K and V, [B, H, n_total, D], where n_total counts every token
// position seen so far. On any error it throws anchorkv::Error and leaves the
// cache unchanged.
//
// Thread safety: every cache may be shared between threads. Readers (fetch,
// attend, the accounting accessors) run in parallel with each other; writers
// (update, update_and_fetch, compress_now, trim) run alone, after the readers
// in flight and before the ones that follow. Each call sees the cache between
// two writes, never in the middle of one.
#pragma once

#include <memory>
#include <string>

#include "anchorkv/config.h"
#include "anchorkv/stats.h"
#include "anchorkv/tensor.h"

namespace anchorkv {

namespace internal {
class CacheStore;    // what one kind of cache stores (src/cache/store.h)
struct CacheCore;    // store + shape bookkeeping + lock (src/cache/core.h)
struct CacheAccess;  // the library's own kernels and tests read the store through it
}  // namespace internal

struct KVPair {
  Tensor keys;    // [B, H, n_total, D] fp16
  Tensor values;  // [B, H, n_total, D] fp16
};

// The base of every cache: validates and stages input, keeps the shape and
// token bookkeeping, and holds the reader/writer lock. Each kind of cache
// supplies a store (what it keeps and how it counts its bytes).
class KVCache {
 public:
  virtual ~KVCache();
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;

  // Adds the tokens and returns the dense fp16 K/V of everything (the seed's contract).
  KVPair update_and_fetch(const TensorView& keys, const TensorView& values);
  // Adds the tokens without building the dense K/V: what a runtime that attends
  // with attend() (which reads the stored form) needs. Same checks and errors.
  void update(const TensorView& keys, const TensorView& values);
  // The same two calls with the real queries of the call's last W positions
  // (the observation window), [B, Hq, W, D] with Hq a multiple of H (GQA:
  // query head hq belongs to KV head hq / (Hq / H)) and 1 <= W <= S, in the
  // domain of the stored keys (rotated when the keys are post-RoPE, unrotated
  // when they are stored before RoPE). Caches that rank tokens by attention
  // use them in place of keys acting as queries: AnchorKV (anchor scores and
  // residual utilities of the prefill it compresses), SnapKV (its observation
  // window) and H2O (attention received). Every other cache ignores them.
  // Without queries a cache behaves as the seed does.
  KVPair update_and_fetch(const TensorView& keys, const TensorView& values, const TensorView& queries);
  void update(const TensorView& keys, const TensorView& values, const TensorView& queries);
  // The dense fp16 K/V of everything stored, without adding tokens.
  KVPair fetch() const;

  std::string name() const;
  // Token positions per (batch, head) row seen so far.
  int64_t offset() const;
  // Batch size, heads and head dim of the tokens held (0s before the first call).
  struct Shape {
    int64_t batch = 0, heads = 0, head_dim = 0;
  };
  Shape shape() const;
  bool is_trimmable() const;
  // Bytes this cache really stores for K/V (the compressed form where there is one).
  int64_t nbytes() const;
  // fp16 K + V bytes for the same tokens: sum over calls of B*H*S*D*4.
  int64_t full_seq_bytes() const;
  // Token positions ever passed in, all (batch, head) rows summed.
  int64_t tokens_total() const;
  // Token positions still inside the softmax, all rows summed.
  int64_t tokens_kept() const;
  // full_seq_bytes / nbytes; 1.0 while empty.
  double compression_ratio() const;

 protected:
  explicit KVCache(std::unique_ptr<internal::CacheStore> store);

 private:
  friend struct internal::CacheAccess;
  std::unique_ptr<internal::CacheCore> core_;
};

// Plain fp16 cache: the reference every comparison uses.
class FullKVCache final : public KVCache {
 public:
  FullKVCache();
  // Drop the last n positions of every row (n <= offset()).
  void trim(int64_t n);
};

// The last `window` positions of every row, exact fp16: the cache of a
// sliding-window attention layer (Gemma 3's local layers attend only that far
// back), a ring that never grows past the window. Older positions are dropped;
// attention sees the kept ones in position order.
class SlidingWindowKVCache final : public KVCache {
 public:
  // Throws Error(kInvalidConfig) unless 1 <= window <= 2^30.
  explicit SlidingWindowKVCache(int64_t window);
  int64_t window() const { return window_; }

 private:
  int64_t window_;
};

// AnchorKV anchor-residual cache (docs/spec.md). Never evicts.
class AnchorKVCache final : public KVCache {
 public:
  // Throws Error(kInvalidConfig) if config.validate() fails.
  explicit AnchorKVCache(const AnchorKVConfig& config = {});

  // Compress every exactly-stored token now (chunked prefill done by hand).
  // Throws Error(kInvalidState) if the cache already holds a compressed
  // segment or holds no token.
  void compress_now();
  bool is_compressed() const;

  // Seed accounting (docs/spec.md §5), equal to the bytes of the stored buffers.
  int64_t anchorkv_bytes() const { return nbytes(); }
  int64_t n_anchor_total() const;
  int64_t n_residual_total() const;  // K + V
  const AnchorKVConfig& config() const { return config_; }
  CompressionStats last_compression_stats() const;

 private:
  AnchorKVConfig config_;  // immutable after construction
};

}  // namespace anchorkv
