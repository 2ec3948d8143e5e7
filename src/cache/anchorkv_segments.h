// Making AnchorKV segments: compressing a run of tokens into one segment, its
// accounting, and committing segments to a cache's state. Shared by the seed
// mode's state machine (anchorkv_cache.cc) and streaming (anchorkv_streaming.cc).
#pragma once

#include <memory>
#include <vector>

#include "cache/anchorkv_state.h"
#include "cache/store.h"
#include "core/buffer.h"

namespace anchorkv::internal {

// A segment computed but not yet committed, with its compression's stats.
struct NewSegment {
  AnchorKVSegment seg;
  CompressionStats stats;
  bool extends_last = false;  // seg is the state's last segment extended: it replaces it
};

// The segment a new one of `tokens` tokens should extend
// (AnchorKVConfig::extend_tokens, compress::extend_row): the last of those
// `planned` to commit before it, else the state's last; when the two hold at
// most extend_tokens, it is not sealed, and the two segments' anchors fit
// the layout's ordinals. Else null.
const AnchorKVSegment* segment_to_extend(const AnchorKVState& st, const std::vector<NewSegment>& planned,
                                         int64_t tokens);

// The codec every segment of `st` uses (st's, or a new one before the first).
std::shared_ptr<const compress::ResidualCodec> state_codec(const AnchorKVState& st, int64_t D);

// Compresses contiguous [B, H, S, D] f32 K/V (fp16-representable) that start
// at cache position pos0, under `cfg` (its key_rope moved to pos0). `after`:
// the queries sit after the segment (a streaming segment) rather than at its
// last positions. `extend` (may be null): the segment ending at pos0 that the
// new one extends (segment_to_extend); the result is then the two as one
// (extends_last). Touches no state.
NewSegment compress_segment(const AnchorKVConfig& cfg, const compress::ResidualCodec& codec, const CacheShape& shape,
                            int64_t pos0, int64_t S, const float* K, const float* V,
                            const cache::ObservationQueries& queries, bool after,
                            const AnchorKVSegment* extend = nullptr);

// The seed accounting of a segment's rows (docs/spec.md §5), their residual
// slot indexes and anchor positions.
void count_segment(AnchorKVSegment& seg, int64_t D, int bits);
// The key_rope a segment starting at cache position pos0 is coded with.
RopeOptions segment_key_rope(const AnchorKVConfig& cfg, int64_t pos0);

// Appends computed segments (room reserved by the caller; one that
// extends_last replaces the last) and recounts.
void commit_segments(AnchorKVState& st, std::vector<NewSegment>&& segs,
                     std::shared_ptr<const compress::ResidualCodec> codec) noexcept;
// The state's totals over its segments.
void recount(AnchorKVState& st) noexcept;

// Rows [rows, b - a, D] of K, then of V, f32, from exact rows' positions [a, b).
core::UninitVector<float> exact_f32(const cache::ExactRows& x, int64_t rows, int64_t D, int64_t a, int64_t b,
                                    int threads);

}  // namespace anchorkv::internal
