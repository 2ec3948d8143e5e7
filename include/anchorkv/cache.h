// KV caches. One cache object holds one transformer layer's K/V for a batch.
//
// update_and_fetch(keys, values): keys/values are [B, H, S, D] views of the
// same shape (f32, f16 or bf16); B, H, D must match earlier calls. Returns the
// dense fp16 K and V, [B, H, n_total, D], where n_total counts every token
// position seen so far. On any error it throws anchorkv::Error and leaves the
// cache unchanged. Caches are not thread-safe: one caller at a time.
#pragma once

#include <memory>
#include <string>

#include "anchorkv/config.h"
#include "anchorkv/tensor.h"

namespace anchorkv {

struct KVPair {
  Tensor keys;    // [B, H, n_total, D] fp16
  Tensor values;  // [B, H, n_total, D] fp16
};

class KVCache {
 public:
  virtual ~KVCache() = default;

  // Adds the tokens and returns the dense fp16 K/V of everything (the seed's contract).
  KVPair update_and_fetch(const TensorView& keys, const TensorView& values) {
    append(keys, values, "update_and_fetch");
    return fetch();
  }
  // Adds the tokens without building the dense K/V: what a runtime that attends
  // with attend() (which reads the stored form) needs. Same checks and errors.
  void update(const TensorView& keys, const TensorView& values) { append(keys, values, "update"); }
  // The dense fp16 K/V of everything stored, without adding tokens.
  virtual KVPair fetch() const = 0;

  virtual std::string name() const = 0;
  // Token positions per (batch, head) row seen so far.
  virtual int64_t offset() const = 0;
  virtual bool is_trimmable() const = 0;
  // Bytes this cache really stores for K/V (the compressed form where there is one).
  virtual int64_t nbytes() const = 0;
  // fp16 K + V bytes for the same tokens: sum over calls of B*H*S*D*4.
  virtual int64_t full_seq_bytes() const = 0;
  // Token positions ever passed in, all (batch, head) rows summed.
  virtual int64_t tokens_total() const = 0;
  // Token positions still inside the softmax, all rows summed.
  virtual int64_t tokens_kept() const = 0;
  // full_seq_bytes / nbytes; 1.0 while empty.
  double compression_ratio() const;

 protected:
  // Validates and stores the tokens; `method` names the public call in errors.
  virtual void append(const TensorView& keys, const TensorView& values, const char* method) = 0;
};

namespace internal {
struct AnchorKVState;
struct FullState;
}  // namespace internal

// Plain fp16 cache: the reference every comparison uses.
class FullKVCache final : public KVCache {
 public:
  FullKVCache();
  ~FullKVCache() override;
  FullKVCache(FullKVCache&&) noexcept;
  FullKVCache& operator=(FullKVCache&&) noexcept;

  KVPair fetch() const override;
  std::string name() const override { return "full"; }
  int64_t offset() const override;
  bool is_trimmable() const override { return true; }
  // Drop the last n positions of every row (n <= offset()).
  void trim(int64_t n);
  int64_t nbytes() const override;
  int64_t full_seq_bytes() const override { return nbytes(); }
  int64_t tokens_total() const override;
  int64_t tokens_kept() const override { return tokens_total(); }

  // Internal state for the library's own kernels and tests.
  const internal::FullState& state() const;

 protected:
  void append(const TensorView& keys, const TensorView& values, const char* method) override;

 private:
  std::unique_ptr<internal::FullState> impl_;
};

// Per-stage wall time of the last compression, seconds.
struct CompressionStats {
  double scores_s = 0;    // proxy-query logits + softmax
  double anchors_s = 0;   // anchor selection + observation outputs y_w
  double assign_s = 0;    // assignment, projection, residual utilities
  double allocate_s = 0;  // budget and top-N allocation
  double encode_s = 0;    // residual codec
  double total_s = 0;
  int64_t rows = 0;    // (batch, head) rows compressed
  int64_t tokens = 0;  // tokens per row
};

// AnchorKV anchor-residual cache (spec ANCHORKV_SPEC.md). Never evicts.
class AnchorKVCache final : public KVCache {
 public:
  // Throws Error(kInvalidConfig) if config.validate() fails.
  explicit AnchorKVCache(const AnchorKVConfig& config = {});
  ~AnchorKVCache() override;
  AnchorKVCache(AnchorKVCache&&) noexcept;
  AnchorKVCache& operator=(AnchorKVCache&&) noexcept;

  KVPair fetch() const override;
  std::string name() const override { return "anchorkv"; }
  int64_t offset() const override;
  // False: trimming would desynchronise the compressed state.
  bool is_trimmable() const override { return false; }
  int64_t nbytes() const override { return anchorkv_bytes(); }
  int64_t full_seq_bytes() const override;
  int64_t tokens_total() const override;
  int64_t tokens_kept() const override { return tokens_total(); }

  // Compress every exactly-stored token now (chunked prefill done by hand).
  // Throws Error(kInvalidState) if the cache already holds a compressed
  // segment or holds no token.
  void compress_now();
  bool is_compressed() const;

  // Seed accounting (spec §5), equal to the bytes of the stored buffers.
  int64_t anchorkv_bytes() const;
  int64_t n_anchor_total() const;
  int64_t n_residual_total() const;  // K + V
  const AnchorKVConfig& config() const;
  const CompressionStats& last_compression_stats() const;

  // Internal state for the library's own kernels and tests.
  const internal::AnchorKVState& state() const;

 protected:
  void append(const TensorView& keys, const TensorView& values, const char* method) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anchorkv
