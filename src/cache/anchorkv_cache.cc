// AnchorKVCache as a state machine over (head, segment, tail):
//   empty --S>1 (first prefill)--> segment        [kFirstPrefill]
//   empty --S==1 / chunks--------> head           (exact)
//   head  --first S==1 after a chunk--> segment   [kFirstDecode]
//   head  --compress_now()--------> segment
//   segment --any call------------> tail          (exact)
#include <algorithm>
#include <string>
#include <utility>

#include "anchorkv/cache.h"
#include "cache/anchorkv_state.h"
#include "cache/core.h"
#include "compress/budget.h"
#include "compress/compressor.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/parallel.h"

namespace anchorkv {

namespace internal {
int64_t AnchorKVState::buffer_bytes() const {
  int64_t n = head.buffer_bytes() + tail.buffer_bytes();
  for (const auto& row : segment) n += row.buffer_bytes();
  return n;
}
}  // namespace internal

namespace {

using internal::AnchorKVState;

struct NewSegment {
  std::vector<compress::CompressedRow> rows;
  std::shared_ptr<const compress::ResidualCodec> codec;
  int64_t tokens = 0, bytes = 0, n_anchor = 0, n_residual = 0;
  CompressionStats stats;
};

// Compresses contiguous [B, H, S, D] f32 K/V (fp16-representable). Touches no state.
NewSegment compress_segment(const AnchorKVState& st, const internal::CacheShape& shape, int64_t S, const float* K,
                            const float* V) {
  const AnchorKVConfig& cfg = st.config;
  const int64_t D = shape.D;
  compress::SegmentInput in{shape.B, shape.H, S, D, K, V};
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

void commit_segment(AnchorKVState& st, NewSegment&& seg) noexcept {
  st.segment = std::move(seg.rows);
  st.codec = std::move(seg.codec);
  st.segment_tokens = seg.tokens;
  st.segment_bytes = seg.bytes;
  st.n_anchor_total = seg.n_anchor;
  st.n_residual_total = seg.n_residual;
  st.stats = seg.stats;
}

NewSegment compress_head(const AnchorKVState& st, const internal::CacheShape& shape) {
  const int64_t S = st.head.tokens, D = shape.D;
  core::UninitVector<float> K(static_cast<size_t>(shape.rows() * S * D)), V(K.size());
  core::parallel_for(shape.rows(), st.config.threads, [&](int64_t r) {
    core::f16_to_f32_n(st.head.k[r].data(), &K[static_cast<size_t>(r * S * D)], S * D);
    core::f16_to_f32_n(st.head.v[r].data(), &V[static_cast<size_t>(r * S * D)], S * D);
  });
  return compress_segment(st, shape, S, K.data(), V.data());
}

class AnchorKVStore final : public internal::CacheStore {
 public:
  explicit AnchorKVStore(const AnchorKVConfig& config) { st_.config = config; }
  std::string name() const override { return "anchorkv"; }
  const char* api_name() const override { return "anchorkv::AnchorKVCache"; }

  void store(const cache::StagedInput& in, const internal::CacheShape& shape) override {
    AnchorKVState& st = st_;
    const int64_t S = in.S();
    const CompressTrigger trigger = st.config.trigger;
    if (!st.compressed() && trigger == CompressTrigger::kFirstPrefill && S > 1) {
      NewSegment seg = compress_segment(st, shape, S, in.k.data(), in.v.data());
      st.tail.resize_rows(shape.rows());
      commit_segment(st, std::move(seg));
    } else if (!st.compressed() && trigger == CompressTrigger::kFirstDecode && S == 1 && st.seen_prefill_call &&
               st.head.tokens > 0) {
      NewSegment seg = compress_head(st, shape);
      cache::ExactRows tail;
      tail.append(in);
      commit_segment(st, std::move(seg));
      st.head.clear();
      st.tail = std::move(tail);
    } else if (st.compressed()) {
      st.tail.append(in);
    } else {
      st.head.append(in);
    }
    if (S > 1) st.seen_prefill_call = true;
  }

  void compress_now(const internal::CacheShape& shape) {
    AnchorKVState& st = st_;
    constexpr const char* op = "anchorkv::AnchorKVCache::compress_now";
    if (st.compressed())
      core::fail(ErrorCode::kInvalidState, op, "the cache already holds a compressed segment");
    if (st.head.tokens == 0) core::fail(ErrorCode::kInvalidState, op, "the cache holds no token to compress");
    NewSegment seg = compress_head(st, shape);
    commit_segment(st, std::move(seg));
    st.head.clear();
    st.tail.resize_rows(shape.rows());
  }

  KVPair fetch(const internal::CacheShape&) const override;

  int64_t nbytes(const internal::CacheShape& shape) const override {
    return st_.segment_bytes + (st_.head.tokens + st_.tail.tokens) * shape.rows() * shape.D * 4;
  }

  cache::AttentionSource attention_source(const internal::CacheShape& shape) const override {
    cache::AttentionSource src{shape.B, shape.H, shape.D, st_.tokens_per_row()};
    if (st_.head.tokens > 0) src.dense_before.push_back(cache::dense_region(st_.head, 0));
    if (st_.compressed())
      src.segment = cache::CompressedRegion{&st_.segment, st_.codec.get(), st_.segment_tokens, st_.head.tokens};
    if (st_.tail.tokens > 0)
      src.dense_after.push_back(cache::dense_region(st_.tail, st_.head.tokens + st_.segment_tokens));
    return src;
  }

  const AnchorKVState& state() const { return st_; }

 private:
  AnchorKVState st_;
};

KVPair AnchorKVStore::fetch(const internal::CacheShape& shape) const {
  const AnchorKVState& st = st_;
  const int64_t n = st.tokens_per_row(), D = shape.D;
  KVPair out{Tensor(DType::kF16, {shape.B, shape.H, n, D}), Tensor(DType::kF16, {shape.B, shape.H, n, D})};
  uint16_t* ok = out.keys.data_as<uint16_t>();
  uint16_t* ov = out.values.data_as<uint16_t>();
  core::parallel_for(shape.rows(), st.config.threads, [&](int64_t r) {
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

}  // namespace

AnchorKVCache::AnchorKVCache(const AnchorKVConfig& config)
    : KVCache((config.validate(), std::make_unique<AnchorKVStore>(config))), config_(config) {}

void AnchorKVCache::compress_now() {
  auto w = internal::CacheAccess::write<AnchorKVStore>(*this);
  w.store.compress_now(w.shape);
}

bool AnchorKVCache::is_compressed() const {
  return internal::CacheAccess::read<AnchorKVStore>(*this).store.state().compressed();
}
int64_t AnchorKVCache::n_anchor_total() const {
  return internal::CacheAccess::read<AnchorKVStore>(*this).store.state().n_anchor_total;
}
int64_t AnchorKVCache::n_residual_total() const {
  return internal::CacheAccess::read<AnchorKVStore>(*this).store.state().n_residual_total;
}
CompressionStats AnchorKVCache::last_compression_stats() const {
  return internal::CacheAccess::read<AnchorKVStore>(*this).store.state().stats;
}

const internal::AnchorKVState& internal::unlocked_state(const AnchorKVCache& cache) {
  auto r = CacheAccess::read<AnchorKVStore>(cache);
  return r.store.state();
}

}  // namespace anchorkv
