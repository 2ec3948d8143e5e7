// AnchorKVCache as a state machine over (head, segments, tail).
// Seed mode (segment_tokens == 0), one segment at most:
//   empty --S>1 (first prefill)--> segment        [kFirstPrefill]
//   empty --S==1 / chunks--------> head           (exact)
//   head  --first S==1 after a chunk--> segment   [kFirstDecode]
//   head  --compress_now()--------> segment
//   segment --any call------------> tail          (exact)
// Streaming mode (segment_tokens == T > 0, recent_tokens == R):
//   every call appends to the tail; while the tail holds R + T tokens or more,
//   its oldest T become a new segment (compress_now() closes the whole tail).
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
  for (const auto& seg : segments)
    for (const auto& row : seg.rows) n += row.buffer_bytes();
  return n;
}
}  // namespace internal

namespace {

using internal::AnchorKVSegment;
using internal::AnchorKVState;

// A segment computed but not yet committed, with its compression's stats.
struct NewSegment {
  AnchorKVSegment seg;
  CompressionStats stats;
};

// The seed accounting of the segment's rows (docs/spec.md §5), their
// residual slot indexes and anchor positions (pre-RoPE and masked attention
// need them every call, and the seed layout finds them by searching the
// metadata; rows of the other layouts list them: empty here, not copied).
void count_segment(AnchorKVSegment& seg, int64_t D, int bits) {
  const int64_t b_res = compress::residual_bytes(D, bits);
  seg.bytes = seg.n_anchor = seg.n_residual = 0;
  seg.slots.clear();
  seg.anchor_pos.clear();
  for (const auto& row : seg.rows) {
    seg.bytes += compress::base_row_bytes(seg.tokens, row.n_anchor, D, row.layout) + row.n_residual() * b_res;
    seg.n_anchor += row.n_anchor;
    seg.n_residual += row.n_residual();
    seg.slots.push_back(compress::residual_slot_index(row));
    seg.anchor_pos.push_back(row.lists_positions() ? std::vector<int32_t>{} : row.anchor_positions());
  }
}

// The key_rope a segment starting at cache position pos0 is coded with.
RopeOptions segment_key_rope(const AnchorKVConfig& cfg, int64_t pos0) {
  RopeOptions r = cfg.key_rope;
  if (r.enabled) r.position_offset += pos0;
  return r;
}

std::shared_ptr<const compress::ResidualCodec> state_codec(const AnchorKVState& st, int64_t D) {
  const AnchorKVConfig& c = st.config;
  return st.codec ? st.codec : std::make_shared<const compress::ResidualCodec>(D, c.residual_bits, c.scale, c.seed);
}

// Compresses contiguous [B, H, S, D] f32 K/V (fp16-representable) that start
// at cache position pos0. `after`: the queries sit after the segment (a
// streaming segment) rather than at its last positions. Touches no state.
NewSegment compress_segment(const AnchorKVState& st, const compress::ResidualCodec& codec,
                            const internal::CacheShape& shape, int64_t pos0, int64_t S, const float* K,
                            const float* V, const cache::ObservationQueries& queries, bool after) {
  AnchorKVConfig cfg = st.config;
  cfg.key_rope = segment_key_rope(cfg, pos0);
  const int64_t D = shape.D;
  compress::SegmentInput in{shape.B, shape.H, S, D, K, V};
  if (!queries.empty()) {
    in.Q = queries.q.data();
    in.G = queries.G;
    in.W = queries.W;
    in.queries_after = after;
  }
  NewSegment out;
  out.seg.rows = compress::compress(in, cfg, codec, &out.stats);
  out.seg.pos0 = pos0;
  out.seg.tokens = S;
  count_segment(out.seg, D, cfg.residual_bits);
  return out;
}

void recount(AnchorKVState& st) noexcept {
  st.segment_bytes = st.n_anchor_total = st.n_residual_total = 0;
  for (const auto& seg : st.segments) {
    st.segment_bytes += seg.bytes;
    st.n_anchor_total += seg.n_anchor;
    st.n_residual_total += seg.n_residual;
  }
}

// Appends computed segments (room for them reserved by the caller).
void commit_segments(AnchorKVState& st, std::vector<NewSegment>&& segs,
                     std::shared_ptr<const compress::ResidualCodec> codec) noexcept {
  for (NewSegment& s : segs) {
    st.segments.push_back(std::move(s.seg));
    st.stats = s.stats;
  }
  if (!segs.empty()) st.codec = std::move(codec);
  recount(st);
}

// Rows [rows, n, D] f32 from exact rows' positions [a, b).
core::UninitVector<float> exact_f32(const cache::ExactRows& x, int64_t rows, int64_t D, int64_t a, int64_t b,
                                    int threads) {
  const int64_t n = b - a;
  core::UninitVector<float> out(static_cast<size_t>(rows * 2 * n * D));
  core::parallel_for(rows, threads, [&](int64_t r) {
    core::f16_to_f32_n(x.k[r].data() + a * D, &out[static_cast<size_t>(r * n * D)], n * D);
    core::f16_to_f32_n(x.v[r].data() + a * D, &out[static_cast<size_t>((rows + r) * n * D)], n * D);
  });
  return out;
}

NewSegment compress_head(const AnchorKVState& st, const compress::ResidualCodec& codec,
                         const internal::CacheShape& shape) {
  const int64_t S = st.head.tokens, rows = shape.rows(), D = shape.D;
  const core::UninitVector<float> kv = exact_f32(st.head, rows, D, 0, S, st.config.threads);
  return compress_segment(st, codec, shape, 0, S, kv.data(), kv.data() + rows * S * D, st.queries, false);
}

// Streaming: the tail followed by the call's tokens, cut into the segments
// that close now (positions [j T, (j + 1) T) of that sequence, j < count).
struct StreamPlan {
  int64_t count = 0;       // segments to close
  int64_t from_tail = 0;   // tail tokens they take
  int64_t from_input = 0;  // call tokens they take (the rest is appended)
};

StreamPlan plan_stream(const AnchorKVState& st, int64_t S) {
  const int64_t T = st.config.segment_tokens, R = st.config.recent_tokens, n = st.tail.tokens + S;
  StreamPlan p;
  p.count = n - R >= T ? (n - R) / T : 0;
  p.from_tail = std::min(st.tail.tokens, p.count * T);
  p.from_input = p.count * T - p.from_tail;
  return p;
}

// The K/V [rows, T, D] of positions [a, a + T) of tail ++ input.
void gather_stream(const AnchorKVState& st, const cache::StagedInput& in, int64_t rows, int64_t D, int64_t a,
                   int64_t T, float* K, float* V) {
  const int64_t t0 = st.tail.tokens;
  core::parallel_for(rows, st.config.threads, [&](int64_t r) {
    const int64_t n_tail = std::clamp<int64_t>(t0 - a, 0, T), from = std::max<int64_t>(a - t0, 0);
    float* k = K + r * T * D;
    float* v = V + r * T * D;
    if (n_tail > 0) {
      core::f16_to_f32_n(st.tail.k[r].data() + a * D, k, n_tail * D);
      core::f16_to_f32_n(st.tail.v[r].data() + a * D, v, n_tail * D);
    }
    std::copy_n(in.key_row(r) + from * D, (T - n_tail) * D, k + n_tail * D);
    std::copy_n(in.value_row(r) + from * D, (T - n_tail) * D, v + n_tail * D);
  });
}

// The query window a streaming call leaves behind: `st`'s, or a new one when
// the call's queries have another shape (allocated here, so the commit that
// pushes the call's queries cannot throw). Null when the call brings none.
struct WindowUpdate {
  cache::QueryWindow fresh;
  bool replaces = false;
  const cache::ObservationQueries* given = nullptr;
};

WindowUpdate plan_window(const AnchorKVState& st, const cache::StagedInput& in, int64_t rows) {
  WindowUpdate u;
  if (in.queries.empty()) return u;
  u.given = &in.queries;
  if (!st.recent_queries.fits(in.queries, rows)) {
    u.fresh = cache::QueryWindow(rows, in.queries.G, in.queries.D, std::max<int64_t>(st.config.window, 1));
    u.replaces = true;
  }
  return u;
}

// The queries that score segments closing in this call: the window with the
// call's queries pushed (a copy; segments close once per segment_tokens).
cache::ObservationQueries closing_queries(const AnchorKVState& st, const WindowUpdate& u) {
  if (!u.given) return st.recent_queries.ordered();
  cache::QueryWindow w = u.replaces ? u.fresh : st.recent_queries;
  w.push(*u.given);
  return w.ordered();
}

void commit_window(AnchorKVState& st, WindowUpdate&& u) noexcept {
  if (!u.given) return;
  if (u.replaces) st.recent_queries = std::move(u.fresh);
  st.recent_queries.push(*u.given);
}

class AnchorKVStore final : public internal::CacheStore {
 public:
  explicit AnchorKVStore(const AnchorKVConfig& config) { st_.config = config; }
  std::string name() const override { return "anchorkv"; }
  const char* api_name() const override { return "anchorkv::AnchorKVCache"; }

  void store(const cache::StagedInput& in, const internal::CacheShape& shape) override {
    if (st_.streaming())
      store_streaming(in, shape);
    else
      store_seed(in, shape);
    if (in.S() > 1) st_.seen_prefill_call = true;
  }

  void compress_now(const internal::CacheShape& shape);

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

 private:
  void store_seed(const cache::StagedInput& in, const internal::CacheShape& shape);
  void store_streaming(const cache::StagedInput& in, const internal::CacheShape& shape);

  AnchorKVState st_;
};

void AnchorKVStore::store_seed(const cache::StagedInput& in, const internal::CacheShape& shape) {
  AnchorKVState& st = st_;
  const int64_t S = in.S();
  const CompressTrigger trigger = st.config.trigger;
  if (!st.compressed() && trigger == CompressTrigger::kFirstPrefill && S > 1) {
    auto codec = state_codec(st, shape.D);
    std::vector<NewSegment> segs;
    segs.push_back(compress_segment(st, *codec, shape, st.head.tokens, S, in.k.data(), in.v.data(), in.queries, false));
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

// Compute (the closing segments, the query window, room for both), then
// commit: nothing after the tail's append can throw.
void AnchorKVStore::store_streaming(const cache::StagedInput& in, const internal::CacheShape& shape) {
  AnchorKVState& st = st_;
  const int64_t rows = shape.rows(), D = shape.D, T = st.config.segment_tokens;
  WindowUpdate window = plan_window(st, in, rows);
  const StreamPlan plan = plan_stream(st, in.S());
  auto codec = state_codec(st, D);
  std::vector<NewSegment> segs;
  if (plan.count > 0) {
    const cache::ObservationQueries queries = closing_queries(st, window);
    core::UninitVector<float> K(static_cast<size_t>(rows * T * D)), V(K.size());
    for (int64_t j = 0; j < plan.count; ++j) {
      gather_stream(st, in, rows, D, j * T, T, K.data(), V.data());
      const int64_t pos0 = st.head.tokens + st.compressed_tokens() + j * T;
      segs.push_back(compress_segment(st, *codec, shape, pos0, T, K.data(), V.data(), queries, true));
    }
  }
  st.segments.reserve(st.segments.size() + segs.size());
  st.tail.append(in, plan.from_input);
  st.tail.drop_front(plan.from_tail, D);
  commit_segments(st, std::move(segs), std::move(codec));
  commit_window(st, std::move(window));
}

void AnchorKVStore::compress_now(const internal::CacheShape& shape) {
  AnchorKVState& st = st_;
  constexpr const char* op = "anchorkv::AnchorKVCache::compress_now";
  auto codec = state_codec(st, shape.D);
  std::vector<NewSegment> segs;
  if (st.streaming()) {  // the whole exact tail, as one segment
    if (st.tail.tokens == 0) core::fail(ErrorCode::kInvalidState, op, "the cache holds no exact token to compress");
    const int64_t S = st.tail.tokens, rows = shape.rows(), D = shape.D;
    const core::UninitVector<float> kv = exact_f32(st.tail, rows, D, 0, S, st.config.threads);
    segs.push_back(compress_segment(st, *codec, shape, st.head.tokens + st.compressed_tokens(), S, kv.data(),
                                    kv.data() + rows * S * D, st.recent_queries.ordered(), true));
    st.segments.reserve(st.segments.size() + 1);
    st.tail.drop_front(S, D);
    commit_segments(st, std::move(segs), std::move(codec));
    return;
  }
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
      const uint64_t n_rows = r.get<uint64_t>("segment.rows");
      if (n_rows == 0) r.fail("segment.rows", "a segment without rows");
      st.segments.push_back(load_segment(r, cfg, shape, pos, tokens, n_rows));
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
  return internal::rebuild(r, "config", [&] { return std::make_unique<AnchorKVCache>(c); });
}

const internal::AnchorKVState& internal::unlocked_state(const AnchorKVCache& cache) {
  auto r = CacheAccess::read<AnchorKVStore>(cache);
  return r.store.state();
}

}  // namespace anchorkv
