#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "anchorkv/cache.h"
#include "cache/anchorkv_state.h"
#include "cache/input.h"
#include "compress/budget.h"
#include "compress/compressor.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"

namespace anchorkv {

namespace internal {
int64_t AnchorKVState::buffer_bytes() const {
  int64_t n = head.buffer_bytes() + tail.buffer_bytes();
  for (const auto& row : segment) n += row.buffer_bytes();
  return n;
}
}  // namespace internal

struct AnchorKVCache::Impl {
  internal::AnchorKVState st;
  CompressionStats stats;
};

AnchorKVCache::AnchorKVCache(const AnchorKVConfig& config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  impl_->st.config = config;
}
AnchorKVCache::~AnchorKVCache() = default;
AnchorKVCache::AnchorKVCache(AnchorKVCache&&) noexcept = default;
AnchorKVCache& AnchorKVCache::operator=(AnchorKVCache&&) noexcept = default;

namespace {

struct NewSegment {
  std::vector<compress::CompressedRow> rows;
  std::shared_ptr<const compress::ResidualCodec> codec;
  int64_t tokens = 0, bytes = 0, n_anchor = 0, n_residual = 0;
  CompressionStats stats;
};

// Compresses contiguous [B, H, S, D] f32 K/V (fp16-representable). Touches no state.
NewSegment compress_segment(const internal::AnchorKVState& st, int64_t S, const float* K, const float* V) {
  const AnchorKVConfig& cfg = st.config;
  const int64_t D = st.D;
  compress::SegmentInput in{st.B, st.H, S, D, K, V};
  NewSegment seg;
  seg.codec =
      st.codec ? st.codec
               : std::make_shared<const compress::ResidualCodec>(D, cfg.residual_bits, cfg.scale, cfg.seed);
  seg.rows = compress::compress(in, cfg, *seg.codec, &seg.stats);
  seg.tokens = S;
  const int64_t b_res = compress::residual_bytes(D, cfg.residual_bits);
  for (const auto& row : seg.rows) {
    seg.bytes += compress::base_row_bytes(S, row.n_anchor, D, row.compact) + row.n_residual() * b_res;
    seg.n_anchor += row.n_anchor;
    seg.n_residual += row.n_residual();
  }
  return seg;
}

void commit_segment(internal::AnchorKVState& st, NewSegment&& seg, CompressionStats& stats) noexcept {
  st.segment = std::move(seg.rows);
  st.codec = std::move(seg.codec);
  st.segment_tokens = seg.tokens;
  st.segment_bytes = seg.bytes;
  st.n_anchor_total = seg.n_anchor;
  st.n_residual_total = seg.n_residual;
  stats = seg.stats;
}

NewSegment compress_head(const internal::AnchorKVState& st) {
  const int64_t S = st.head.tokens, D = st.D;
  core::UninitVector<float> K(static_cast<size_t>(st.rows() * S * D)), V(K.size());
  core::parallel_for(st.rows(), st.config.threads, [&](int64_t r) {
    core::f16_to_f32_n(st.head.k[r].data(), &K[static_cast<size_t>(r * S * D)], S * D);
    core::f16_to_f32_n(st.head.v[r].data(), &V[static_cast<size_t>(r * S * D)], S * D);
  });
  return compress_segment(st, S, K.data(), V.data());
}

}  // namespace

void AnchorKVCache::append(const TensorView& keys, const TensorView& values, const char* method) {
  internal::AnchorKVState& st = impl_->st;
  cache::StagedInput in = cache::stage_input(std::string("anchorkv::AnchorKVCache::") + method, keys, values,
                                             st.has_shape, st.B, st.H, st.D);
  const int64_t S = in.S();
  const bool first_shape = !st.has_shape;
  if (first_shape) {  // shape facts are needed by compression; roll back on failure
    st.has_shape = true;
    st.B = in.B();
    st.H = in.H();
    st.D = in.D();
  }
  try {
    if (!st.compressed() && st.config.trigger == CompressTrigger::kFirstPrefill && S > 1) {
      NewSegment seg = compress_segment(st, S, in.k.data(), in.v.data());
      st.tail.resize_rows(st.rows());
      commit_segment(st, std::move(seg), impl_->stats);
    } else if (!st.compressed() && st.config.trigger == CompressTrigger::kFirstDecode && S == 1 &&
               st.seen_prefill_call && st.head.tokens > 0) {
      NewSegment seg = compress_head(st);
      cache::ExactRows tail;
      tail.append(in);
      commit_segment(st, std::move(seg), impl_->stats);
      st.head.clear();
      st.tail = std::move(tail);
    } else if (st.compressed()) {
      st.tail.append(in);
    } else {
      st.head.append(in);
    }
  } catch (...) {
    if (first_shape) st.has_shape = false;
    throw;
  }
  if (S > 1) st.seen_prefill_call = true;
  st.full_seq_bytes += in.B() * in.H() * S * in.D() * 4;
  st.tokens_total += in.B() * in.H() * S;
}

void AnchorKVCache::compress_now() {
  internal::AnchorKVState& st = impl_->st;
  constexpr const char* op = "anchorkv::AnchorKVCache::compress_now";
  if (st.compressed())
    core::fail(ErrorCode::kInvalidState, op, "the cache already holds a compressed segment");
  if (st.head.tokens == 0) core::fail(ErrorCode::kInvalidState, op, "the cache holds no token to compress");
  NewSegment seg = compress_head(st);
  commit_segment(st, std::move(seg), impl_->stats);
  st.head.clear();
  st.tail.resize_rows(st.rows());
}

KVPair AnchorKVCache::fetch() const {
  const internal::AnchorKVState& st = impl_->st;
  const int64_t n = st.tokens_per_row(), D = st.D;
  KVPair out{Tensor(DType::kF16, {st.B, st.H, n, D}), Tensor(DType::kF16, {st.B, st.H, n, D})};
  uint16_t* ok = out.keys.data_as<uint16_t>();
  uint16_t* ov = out.values.data_as<uint16_t>();
  core::parallel_for(st.rows(), st.config.threads, [&](int64_t r) {
    uint16_t* k = ok + r * n * D;
    uint16_t* v = ov + r * n * D;
    if (st.head.tokens > 0) {
      k = std::copy(st.head.k[r].begin(), st.head.k[r].end(), k);
      v = std::copy(st.head.v[r].begin(), st.head.v[r].end(), v);
    }
    if (st.compressed()) {
      compress::reconstruct_row_fp16(st.segment[r], *st.codec, k, v);
      k += st.segment_tokens * D;
      v += st.segment_tokens * D;
    }
    if (st.tail.tokens > 0) {
      std::copy(st.tail.k[r].begin(), st.tail.k[r].end(), k);
      std::copy(st.tail.v[r].begin(), st.tail.v[r].end(), v);
    }
  });
  return out;
}

int64_t AnchorKVCache::offset() const { return impl_->st.tokens_per_row(); }
int64_t AnchorKVCache::full_seq_bytes() const { return impl_->st.full_seq_bytes; }
int64_t AnchorKVCache::tokens_total() const { return impl_->st.tokens_total; }
bool AnchorKVCache::is_compressed() const { return impl_->st.compressed(); }

int64_t AnchorKVCache::anchorkv_bytes() const {
  const internal::AnchorKVState& st = impl_->st;
  return st.segment_bytes + (st.head.tokens + st.tail.tokens) * st.rows() * st.D * 4;
}
int64_t AnchorKVCache::n_anchor_total() const { return impl_->st.n_anchor_total; }
int64_t AnchorKVCache::n_residual_total() const { return impl_->st.n_residual_total; }
const AnchorKVConfig& AnchorKVCache::config() const { return impl_->st.config; }
const CompressionStats& AnchorKVCache::last_compression_stats() const { return impl_->stats; }
const internal::AnchorKVState& AnchorKVCache::state() const { return impl_->st; }

}  // namespace anchorkv
