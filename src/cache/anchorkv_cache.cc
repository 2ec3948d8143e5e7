// AnchorKVCache as a state machine over (head, segments, tail).
// Seed mode (segment_tokens == 0), one segment at most:
//   empty --S>1 (first prefill)--> segment        [kFirstPrefill]
//   empty --S==1 / chunks--------> head           (exact)
//   head  --first S==1 after a chunk--> segment   [kFirstDecode]
//   head  --compress_now()--------> segment
//   segment --any call------------> tail          (exact)
// Streaming mode (segment_tokens == T > 0, recent_tokens == R): every call
//   appends to the tail, whose oldest T become a segment once it holds R + T
//   (anchorkv_streaming.h; compress_now() closes the whole tail).
#include <algorithm>
#include <string>
#include <utility>

#include "anchorkv/cache.h"
#include "cache/anchorkv_segments.h"
#include "cache/anchorkv_state.h"
#include "cache/anchorkv_streaming.h"
#include "cache/segment_chain.h"
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
  for (const auto& seg : segments)
    for (const auto& row : seg.rows) n += row.buffer_bytes();
  return n;
}
}  // namespace internal

namespace {

using internal::AnchorKVSegment;
using internal::AnchorKVState;
using internal::NewSegment;
using internal::commit_segments;
using internal::count_segment;
using internal::exact_f32;
using internal::recount;
using internal::segment_key_rope;
using internal::state_codec;

NewSegment compress_head(const AnchorKVState& st, const compress::ResidualCodec& codec,
                         const internal::CacheShape& shape) {
  const int64_t S = st.head.tokens, rows = shape.rows(), D = shape.D;
  const core::UninitVector<float> kv = exact_f32(st.head, rows, D, 0, S, st.config.threads);
  return compress_segment(st.config, codec, shape, 0, S, kv.data(), kv.data() + rows * S * D, st.queries, false);
}

class AnchorKVStore final : public internal::CacheStore {
 public:
  explicit AnchorKVStore(const AnchorKVConfig& config) { st_.config = config; }
  std::string name() const override { return "anchorkv"; }
  const char* api_name() const override { return "anchorkv::AnchorKVCache"; }

  void store(const cache::StagedInput& in, const internal::CacheShape& shape) override {
    if (st_.streaming())
      internal::store_streaming(st_, in, shape);
    else
      store_seed(in, shape);
    if (in.S() > 1) st_.seen_prefill_call = true;
  }

  void compress_now(const internal::CacheShape& shape);
  // A streaming cache holds a prompt the same whatever calls brought it, and
  // closes its exact tail into a segment at the prompt's end (scored by the
  // prompt's own last queries), so a pooled or saved prompt stores no exact
  // tail; the seed's cache compressed its first prefill already.
  bool takes_prompt_in_calls() const override { return st_.streaming(); }
  void end_prompt(const internal::CacheShape& shape) override {
    if (st_.streaming() && (st_.tail.tokens > 0 || st_.closing)) internal::close_tail(st_, shape, "anchorkv::end_prompt");
  }

  KVPair fetch(const internal::CacheShape&) const override;

  int64_t nbytes(const internal::CacheShape& shape) const override {
    return st_.segment_bytes + (st_.head.tokens + st_.tail.tokens) * shape.rows() * shape.D * 4;
  }

  cache::AttentionSource attention_source(const internal::CacheShape& shape) const override {
    cache::AttentionSource src{shape.B, shape.H, shape.D, st_.tokens_per_row()};
    if (st_.head.tokens > 0) src.dense_before.push_back(cache::dense_region(st_.head, 0));
    for (const AnchorKVSegment& s : st_.segments)
      src.segments.push_back(
          cache::CompressedRegion{&s.rows, st_.codec.get(), s.tokens, s.pos0, &s.slots, &s.anchor_pos});
    if (st_.tail.tokens > 0)
      src.dense_after.push_back(cache::dense_region(st_.tail, st_.head.tokens + st_.compressed_tokens()));
    return src;
  }

  void save_config(cache::ByteWriter& w) const override;
  void save_state(cache::ByteWriter& w, const internal::CacheShape& shape) const override;
  void load_state(cache::ByteReader& r, const internal::CacheShape& shape) override;

  const AnchorKVState& state() const { return st_; }
  AnchorKVState& mutable_state() { return st_; }

 private:
  void store_seed(const cache::StagedInput& in, const internal::CacheShape& shape);

  AnchorKVState st_;
};

void AnchorKVStore::store_seed(const cache::StagedInput& in, const internal::CacheShape& shape) {
  AnchorKVState& st = st_;
  const int64_t S = in.S();
  const CompressTrigger trigger = st.config.trigger;
  if (!st.compressed() && trigger == CompressTrigger::kFirstPrefill && S > 1) {
    auto codec = state_codec(st, shape.D);
    std::vector<NewSegment> segs;
    segs.push_back(compress_segment(st.config, *codec, shape, st.head.tokens, S, in.k.data(), in.v.data(), in.queries, false));
    st.segments.reserve(1);
    st.tail.resize_rows(shape.rows());
    commit_segments(st, std::move(segs), std::move(codec));
  } else if (!st.compressed() && trigger == CompressTrigger::kFirstDecode && S == 1 && st.seen_prefill_call &&
             st.head.tokens > 0) {
    auto codec = state_codec(st, shape.D);
    std::vector<NewSegment> segs;
    segs.push_back(compress_head(st, *codec, shape));
    cache::ExactRows tail;
    tail.append(in);
    st.segments.reserve(1);
    commit_segments(st, std::move(segs), std::move(codec));
    st.head.clear();
    st.queries = {};
    st.tail = std::move(tail);
  } else if (st.compressed()) {
    st.tail.append(in);
  } else {
    cache::ObservationQueries q = in.queries;  // copied before the append: a throw changes nothing
    st.head.append(in);
    st.queries = std::move(q);
  }
}

void AnchorKVStore::compress_now(const internal::CacheShape& shape) {
  AnchorKVState& st = st_;
  constexpr const char* op = "anchorkv::AnchorKVCache::compress_now";
  auto codec = state_codec(st, shape.D);
  std::vector<NewSegment> segs;
  if (st.streaming()) return internal::close_tail(st, shape, op);
  if (st.compressed()) core::fail(ErrorCode::kInvalidState, op, "the cache already holds a compressed segment");
  if (st.head.tokens == 0) core::fail(ErrorCode::kInvalidState, op, "the cache holds no token to compress");
  segs.push_back(compress_head(st, *codec, shape));
  st.segments.reserve(1);
  commit_segments(st, std::move(segs), std::move(codec));
  st.head.clear();
  st.queries = {};
  st.tail.resize_rows(shape.rows());
}

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
    for (const AnchorKVSegment& seg : st.segments) {
      compress::reconstruct_row_fp16(seg.rows[r], *st.codec, k, v);
      k += seg.tokens * D;
      v += seg.tokens * D;
    }
    if (st.tail.tokens > 0) {
      std::copy(st.tail.k[r].begin(), st.tail.k[r].end(), k);
      std::copy(st.tail.v[r].begin(), st.tail.v[r].end(), v);
    }
  });
  return out;
}

// ---------------------------------------------------------------- persistence (docs/cachefile.md)

void AnchorKVStore::save_config(cache::ByteWriter& w) const {
  const AnchorKVConfig& c = st_.config;
  w.put<double>(c.theta);
  w.put<int64_t>(c.window);
  w.put<double>(c.rho);
  w.put<double>(c.anchor_frac);
  w.put<int32_t>(c.residual_bits);
  w.put<uint64_t>(c.seed);
  for (uint8_t e : {static_cast<uint8_t>(c.allocation), static_cast<uint8_t>(c.scale), static_cast<uint8_t>(c.trigger),
                    static_cast<uint8_t>(c.metadata)})
    w.put<uint8_t>(e);
  w.put<int32_t>(c.threads);
  w.put<uint8_t>(static_cast<uint8_t>(c.anchor_count));  // format 2
  w.put<uint8_t>(c.key_rope.enabled);                     // format 4
  w.put<uint8_t>(static_cast<uint8_t>(c.key_rope.style));
  w.put<double>(c.key_rope.base);
  w.put<int64_t>(c.key_rope.position_offset);
  w.array(c.key_rope.freq_scale);  // format 5
  w.put<int64_t>(c.segment_tokens);  // format 6
  w.put<int64_t>(c.recent_tokens);
  w.put<int64_t>(c.extend_tokens);  // format 7
}

void save_row(cache::ByteWriter& w, const compress::CompressedRow& row) {
  w.put<int64_t>(row.length);
  w.put<int64_t>(row.n_anchor);
  w.put<uint8_t>(static_cast<uint8_t>(row.layout));  // format <= 2: a compact flag (0 or 1)
  w.array(row.anchor_k);
  w.array(row.anchor_v);
  w.array(row.meta);
  w.array(row.meta32);
  w.array(row.anchor_pos);
  w.array(row.meta16);  // format 3
  for (const compress::CompressedSide* side : {&row.k, &row.v}) {
    w.array(side->coef);
    w.array(side->coef16);
    w.array(side->scales);
    w.array(side->codes);
    w.array(side->coef8);  // format 3
    w.put<int8_t>(side->coef_exp);
  }
}

compress::CompressedRow load_row(cache::ByteReader& r, int64_t S, int64_t D, int64_t code_bytes,
                                 MetadataLayout layout, const RopeOptions& key_rope) {
  compress::CompressedRow row;
  row.key_rope = key_rope;
  row.length = r.get<int64_t>("segment.length");
  row.n_anchor = r.get<int64_t>("segment.n_anchor");
  const auto saved = r.get<uint8_t>("segment.layout");
  if (row.length != S) r.fail("segment.length", "a row of " + std::to_string(row.length) + " tokens in a segment of " +
                                                    std::to_string(S));
  if (row.n_anchor < 1 || row.n_anchor > S) r.fail("segment.n_anchor", "must be in [1, " + std::to_string(S) + "]");
  if (saved != static_cast<uint8_t>(layout)) r.fail("segment.layout", "the row's layout differs from the config's");
  row.layout = layout;
  const auto n_anchor = static_cast<uint64_t>(row.n_anchor), n_other = static_cast<uint64_t>(S - row.n_anchor);
  auto count = [&](MetadataLayout l) { return layout == l ? n_other : 0; };
  const bool v3 = r.format_version() >= 3;
  row.anchor_k = r.halves("segment.anchor_k", n_anchor * static_cast<uint64_t>(D));
  row.anchor_v = r.halves("segment.anchor_v", n_anchor * static_cast<uint64_t>(D));
  row.meta = r.array<uint64_t>("segment.meta", count(MetadataLayout::kSeed));
  row.meta32 = r.array<uint32_t>("segment.meta32", count(MetadataLayout::kCompact));
  row.anchor_pos = r.array<int32_t>("segment.anchor_pos", row.lists_positions() ? n_anchor : 0);
  if (v3) row.meta16 = r.array<uint16_t>("segment.meta16", count(MetadataLayout::kTight));
  for (compress::CompressedSide* side : {&row.k, &row.v}) {
    side->coef = r.floats("segment.coef", count(MetadataLayout::kSeed));
    side->coef16 = r.halves("segment.coef16", count(MetadataLayout::kCompact));
    side->scales = r.halves_any("segment.scales");
    side->codes = r.array<uint8_t>("segment.codes", side->scales.size() * static_cast<uint64_t>(code_bytes));
    if (v3) {
      side->coef8 = r.array<uint8_t>("segment.coef8", count(MetadataLayout::kTight));
      side->coef_exp = r.get<int8_t>("segment.coef_exp");
    }
  }
  if (std::string e = compress::check_row(row, D, code_bytes); !e.empty()) r.fail("segment", e);
  return row;
}

void AnchorKVStore::save_state(cache::ByteWriter& w, const internal::CacheShape&) const {
  w.put<uint8_t>(st_.seen_prefill_call);
  cache::save_rows(w, st_.head);
  cache::save_rows(w, st_.tail);
  w.put<uint64_t>(st_.segments.size());  // format 6 (before: i64 tokens, u64 rows of one segment or none)
  for (const AnchorKVSegment& seg : st_.segments) {
    w.put<int64_t>(seg.tokens);
    w.put<uint8_t>(seg.sealed);  // format 7
    w.put<uint64_t>(seg.rows.size());
    for (const auto& row : seg.rows) save_row(w, row);
  }
}

// One segment of `tokens` positions from pos0: `rows` rows, 0 or B * H.
AnchorKVSegment load_segment(cache::ByteReader& r, const AnchorKVConfig& cfg, const internal::CacheShape& shape,
                             int64_t pos0, int64_t tokens, uint64_t n_rows) {
  if (n_rows != 0 && n_rows != static_cast<uint64_t>(shape.rows()))
    r.fail("segment.rows", std::to_string(n_rows) + " rows, expected 0 or " + std::to_string(shape.rows()));
  const int64_t code_bytes = compress::residual_bytes(shape.D, cfg.residual_bits) - 2;
  AnchorKVSegment seg;
  seg.pos0 = pos0;
  seg.tokens = tokens;
  for (uint64_t i = 0; i < n_rows; ++i)
    seg.rows.push_back(load_row(r, tokens, shape.D, code_bytes, cfg.metadata, segment_key_rope(cfg, pos0)));
  count_segment(seg, shape.D, cfg.residual_bits);
  return seg;
}

void AnchorKVStore::load_state(cache::ByteReader& r, const internal::CacheShape& shape) {
  const AnchorKVConfig& cfg = st_.config;
  AnchorKVState st;
  st.config = cfg;
  st.seen_prefill_call = r.flag("seen_prefill_call");
  st.head = cache::load_rows(r, shape.rows(), shape.D, "head");
  st.tail = cache::load_rows(r, shape.rows(), shape.D, "tail");
  int64_t pos = st.head.tokens;
  const int64_t room = shape.seen - st.head.tokens - st.tail.tokens;
  if (room < 0) r.fail("tail", "head + tail tokens exceed the tokens the cache saw");
  if (r.format_version() < 6) {
    const int64_t tokens = r.get<int64_t>("segment_tokens");
    if (tokens < 0 || tokens > room) r.fail("segment_tokens", "outside [0, tokens seen - head - tail]");
    const uint64_t n_rows = r.get<uint64_t>("segment.rows");
    if ((n_rows == 0) != (tokens == 0)) r.fail("segment_tokens", "disagrees with the segment's rows");
    if (n_rows > 0) st.segments.push_back(load_segment(r, cfg, shape, pos, tokens, n_rows));
  } else {
    const uint64_t n_seg = r.get<uint64_t>("segments");
    if (n_seg > static_cast<uint64_t>(room)) r.fail("segments", "more segments than compressed tokens");
    if (!cfg.streaming() && n_seg > 1) r.fail("segments", "a cache in seed mode holds one segment at most");
    for (uint64_t i = 0; i < n_seg; ++i) {
      const int64_t tokens = r.get<int64_t>("segment.tokens");
      if (tokens < 1 || tokens > st.head.tokens + room - pos)
        r.fail("segment.tokens", "outside [1, tokens seen - head - tail - earlier segments]");
      const bool sealed = r.format_version() >= 7 && r.flag("segment.sealed");
      const uint64_t n_rows = r.get<uint64_t>("segment.rows");
      if (n_rows == 0) r.fail("segment.rows", "a segment without rows");
      st.segments.push_back(load_segment(r, cfg, shape, pos, tokens, n_rows));
      st.segments.back().sealed = sealed;
      pos += tokens;
    }
  }
  if (cfg.streaming() && st.head.tokens > 0) r.fail("head", "a streaming cache holds no head");
  if (st.tokens_per_row() != shape.seen)
    r.fail("tail", "head + segments + tail tokens differ from the tokens the cache saw");
  if (st.compressed())
    st.codec = std::make_shared<const compress::ResidualCodec>(shape.D, cfg.residual_bits, cfg.scale, cfg.seed);
  recount(st);
  st_ = std::move(st);
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

std::unique_ptr<KVCache> internal::anchorkv_cache_from_config(cache::ByteReader& r) {
  AnchorKVConfig c;
  c.theta = r.get<double>("config.theta");
  c.window = r.get<int64_t>("config.window");
  c.rho = r.get<double>("config.rho");
  c.anchor_frac = r.get<double>("config.anchor_frac");
  c.residual_bits = r.get<int32_t>("config.residual_bits");
  c.seed = r.get<uint64_t>("config.seed");
  c.allocation = static_cast<ResidualAllocation>(r.get<uint8_t>("config.allocation"));
  c.scale = static_cast<ResidualScale>(r.get<uint8_t>("config.scale"));
  c.trigger = static_cast<CompressTrigger>(r.get<uint8_t>("config.trigger"));
  c.metadata = static_cast<MetadataLayout>(r.get<uint8_t>("config.metadata"));
  c.threads = r.get<int32_t>("config.threads");
  if (r.format_version() >= 2) c.anchor_count = static_cast<AnchorCount>(r.get<uint8_t>("config.anchor_count"));
  if (r.format_version() >= 4) {
    c.key_rope.enabled = r.flag("config.key_rope.enabled");
    c.key_rope.style = static_cast<RopeStyle>(r.get<uint8_t>("config.key_rope.style"));
    c.key_rope.base = r.get<double>("config.key_rope.base");
    c.key_rope.position_offset = r.get<int64_t>("config.key_rope.position_offset");
  }
  if (r.format_version() >= 5) c.key_rope.freq_scale = r.array_any<double>("config.key_rope.freq_scale");
  if (r.format_version() >= 6) {
    c.segment_tokens = r.get<int64_t>("config.segment_tokens");
    c.recent_tokens = r.get<int64_t>("config.recent_tokens");
  }
  if (r.format_version() >= 7) c.extend_tokens = r.get<int64_t>("config.extend_tokens");
  return internal::rebuild(r, "config", [&] { return std::make_unique<AnchorKVCache>(c); });
}

namespace {

// The state of an AnchorKVCache that can be cut into or joined from segments.
bool holds_only_segments(const AnchorKVState& st) {
  return st.streaming() && st.head.tokens == 0 && st.tail.tokens == 0 && !st.closing;
}

void require_only_segments(const AnchorKVState& st, const char* op) {
  if (!holds_only_segments(st))
    core::fail(ErrorCode::kInvalidState, op, "the cache is not a streaming AnchorKV cache holding only segments");
}

const AnchorKVCache& anchorkv_of(const KVCache& cache, const char* op) {
  const auto* a = dynamic_cast<const AnchorKVCache*>(&cache);
  if (!a) core::fail(ErrorCode::kInvalidArgument, op, "not an AnchorKVCache");
  return *a;
}

std::vector<uint8_t> config_bytes(const internal::CacheStore& store) {
  cache::ByteWriter w;
  store.save_config(w);
  return w.bytes();
}

// `seg` moved to start at cache position pos0 (its rows' key_rope with it).
void move_segment(AnchorKVSegment& seg, const AnchorKVConfig& cfg, int64_t pos0) {
  seg.pos0 = pos0;
  const RopeOptions key_rope = segment_key_rope(cfg, pos0);
  for (auto& row : seg.rows) row.key_rope = key_rope;
}

}  // namespace

std::vector<int64_t> internal::segment_lengths(const KVCache& cache) {
  const auto* a = dynamic_cast<const AnchorKVCache*>(&cache);
  if (!a) return {};
  auto r = CacheAccess::read<AnchorKVStore>(*a);
  const AnchorKVState& st = r.store.state();
  if (!holds_only_segments(st)) return {};
  std::vector<int64_t> out;
  for (const AnchorKVSegment& s : st.segments) out.push_back(s.tokens);
  return out;
}

std::unique_ptr<KVCache> internal::copy_segments(const KVCache& cache, size_t first, size_t last) {
  constexpr const char* op = "anchorkv::copy_segments";
  const AnchorKVCache& a = anchorkv_of(cache, op);
  auto out = std::make_unique<AnchorKVCache>(a.config());
  auto r = CacheAccess::read<AnchorKVStore>(a);
  const AnchorKVState& from = r.store.state();
  require_only_segments(from, op);
  if (first >= last || last > from.segments.size())
    core::fail(ErrorCode::kInvalidArgument, op, "segments [" + std::to_string(first) + ", " + std::to_string(last) +
                                                    ") of " + std::to_string(from.segments.size()));
  AnchorKVState st;
  st.config = from.config;
  st.seen_prefill_call = true;
  st.codec = from.codec;
  st.tail.resize_rows(r.shape.rows());  // a streaming cache's head holds no rows
  int64_t pos = 0;
  for (size_t i = first; i < last; ++i) {
    st.segments.push_back(from.segments[i]);
    move_segment(st.segments.back(), st.config, pos);
    pos += st.segments.back().tokens;
  }
  recount(st);
  auto w = CacheAccess::write<AnchorKVStore>(*out);
  w.shape = r.shape;
  w.shape.seen = pos;
  w.store.mutable_state() = std::move(st);
  return out;
}

void internal::seal_segments(KVCache& cache) {
  auto* a = dynamic_cast<AnchorKVCache*>(&cache);
  if (!a) return;
  auto w = CacheAccess::write<AnchorKVStore>(*a);
  for (AnchorKVSegment& s : w.store.mutable_state().segments) s.sealed = true;
}

bool internal::compressing_in_background(const KVCache& cache) {
  const auto* a = dynamic_cast<const AnchorKVCache*>(&cache);
  return a && CacheAccess::read<AnchorKVStore>(*a).store.state().closing != nullptr;
}

void internal::append_segments(KVCache& cache, const KVCache& more) {
  constexpr const char* op = "anchorkv::append_segments";
  if (&cache == &more) core::fail(ErrorCode::kInvalidArgument, op, "a cache appended to itself");
  const AnchorKVCache& src = anchorkv_of(more, op);
  auto& dst = const_cast<AnchorKVCache&>(anchorkv_of(cache, op));
  auto r = CacheAccess::read<AnchorKVStore>(src);
  auto w = CacheAccess::write<AnchorKVStore>(dst);
  const AnchorKVState& add = r.store.state();
  AnchorKVState& st = w.store.mutable_state();
  require_only_segments(add, op);
  if (w.shape.seen > 0) require_only_segments(st, op);
  if (config_bytes(r.store) != config_bytes(w.store))
    core::fail(ErrorCode::kInvalidArgument, op, "the caches' configs differ");
  if (w.shape.known && (w.shape.B != r.shape.B || w.shape.H != r.shape.H || w.shape.D != r.shape.D))
    core::fail(ErrorCode::kShapeMismatch, op, "the caches' B, H or D differ");
  // Everything that may throw first, then a commit that cannot.
  std::vector<AnchorKVSegment> adding = add.segments;
  int64_t pos = w.shape.seen;
  for (AnchorKVSegment& s : adding) {
    move_segment(s, st.config, pos);
    s.sealed = true;
    pos += s.tokens;
  }
  cache::ExactRows tail;  // a streaming cache's head holds no rows
  tail.resize_rows(r.shape.rows());
  st.segments.reserve(st.segments.size() + adding.size());
  if (w.shape.seen == 0) {
    st.head = cache::ExactRows{};
    st.tail = std::move(tail);
  }
  for (AnchorKVSegment& s : adding) st.segments.push_back(std::move(s));
  if (!st.codec) st.codec = add.codec;
  st.seen_prefill_call = true;
  recount(st);
  w.shape = r.shape;
  w.shape.seen = pos;
}

const internal::AnchorKVState& internal::unlocked_state(const AnchorKVCache& cache) {
  auto r = CacheAccess::read<AnchorKVStore>(cache);
  return r.store.state();
}

}  // namespace anchorkv
