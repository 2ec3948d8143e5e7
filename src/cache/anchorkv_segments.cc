#include "cache/anchorkv_segments.h"

#include "compress/budget.h"
#include "compress/compressor.h"
#include "core/convert.h"
#include "core/parallel.h"

namespace anchorkv::internal {

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

const AnchorKVSegment* segment_to_extend(const AnchorKVState& st, const std::vector<NewSegment>& planned,
                                         int64_t tokens) {
  if (!st.streaming() || (planned.empty() && st.segments.empty())) return nullptr;
  const AnchorKVSegment& last = planned.empty() ? st.segments.back() : planned.back().seg;
  if (last.sealed || last.tokens + tokens > st.config.extend_tokens) return nullptr;
  for (const auto& row : last.rows)  // the new segment takes at most one anchor per token
    if (row.n_anchor + tokens > compress::max_anchors(row.layout)) return nullptr;
  return &last;
}

NewSegment compress_segment(const AnchorKVConfig& config, const compress::ResidualCodec& codec, const CacheShape& shape,
                            int64_t pos0, int64_t S, const float* K, const float* V,
                            const cache::ObservationQueries& queries, bool after, const AnchorKVSegment* extend) {
  AnchorKVConfig cfg = config;
  cfg.key_rope = segment_key_rope(cfg, pos0);
  const int64_t D = shape.D;
  compress::SegmentInput in{shape.B, shape.H, S, D, K, V};
  if (!queries.empty()) {
    in.Q = queries.q.data();
    in.G = queries.G;
    in.W = queries.W;
    in.queries_after = after;
  }
  if (extend) in.extends = extend->rows.data();
  NewSegment out;
  out.seg.rows = compress::compress(in, cfg, codec, &out.stats);
  out.seg.pos0 = pos0;
  out.seg.tokens = S;
  if (extend) {
    for (size_t r = 0; r < out.seg.rows.size(); ++r)
      out.seg.rows[r] = compress::extend_row(extend->rows[r], out.seg.rows[r]);
    out.seg.pos0 = extend->pos0;
    out.seg.tokens = extend->tokens + S;
    out.extends_last = true;
  }
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

void commit_segments(AnchorKVState& st, std::vector<NewSegment>&& segs,
                     std::shared_ptr<const compress::ResidualCodec> codec) noexcept {
  for (NewSegment& s : segs) {
    if (s.extends_last)
      st.segments.back() = std::move(s.seg);
    else
      st.segments.push_back(std::move(s.seg));
    st.stats = s.stats;
  }
  if (!segs.empty()) st.codec = std::move(codec);
  recount(st);
}

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

}  // namespace anchorkv::internal
