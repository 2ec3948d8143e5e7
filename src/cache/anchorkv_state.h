// The stored state of an AnchorKVCache, visible to the library's own kernels
// and tests. Each (batch, head) row is, in position order:
//   head      exact fp16 tokens stored before the first segment (seed mode:
//             S == 1 calls that came before the prefill, seed behaviour)
//   segments  compressed segments (one CompressedRow per row each), back to
//             back: seed mode holds at most one (the prefill); streaming mode
//             (AnchorKVConfig::segment_tokens > 0) closes one each time the
//             tail outgrows recent_tokens + segment_tokens
//   tail      exact fp16 tokens after them
#pragma once

#include <memory>
#include <vector>

#include "anchorkv/cache.h"
#include "cache/input.h"
#include "cache/query_window.h"
#include "compress/codec.h"
#include "compress/segment.h"

namespace anchorkv::internal {

// One compressed segment: `tokens` positions per row from position pos0.
struct AnchorKVSegment {
  std::vector<compress::CompressedRow> rows;        // [B * H]
  std::vector<std::vector<int64_t>> slots;          // [B * H] compress::residual_slot_index of each row
  std::vector<std::vector<int32_t>> anchor_pos;     // [B * H] anchor_positions() of seed-layout rows
  int64_t pos0 = 0, tokens = 0;
  // Never extended (AnchorKVConfig::extend_tokens): sealed at a restore
  // point (seal_segments: where a prefix pool cuts its blocks) or put back
  // from elsewhere (append_segments), so a restored session goes on with the
  // bits of the one it was saved from.
  bool sealed = false;
  // Seed accounting (docs/spec.md §5 formula, summed over rows).
  int64_t bytes = 0, n_anchor = 0, n_residual = 0;
};

// A segment compressing on a background thread (anchorkv_streaming.cc).
struct ClosingSegment;

struct AnchorKVState {
  AnchorKVConfig config;
  cache::ExactRows head, tail;
  std::vector<AnchorKVSegment> segments;
  std::shared_ptr<const compress::ResidualCodec> codec;  // every segment's (one config, one codec)
  bool seen_prefill_call = false;  // a call with S > 1 happened
  // Observation queries (not saved in cache files: a cache restored from a
  // file compresses with proxy keys until a call brings queries again).
  // Seed mode: those given with the call that last appended to the head,
  // which compressing the head scores with. Streaming: the newest `window`
  // positions' queries of every call that brought some; a closing segment
  // is scored with them.
  cache::ObservationQueries queries;
  cache::QueryWindow recent_queries;
  // Streaming: the tail's oldest segment_tokens, compressing off the decode
  // path; they stay in the tail, exact, until a later call commits them.
  std::shared_ptr<ClosingSegment> closing;

  // Seed accounting over every segment, updated at each change.
  int64_t segment_bytes = 0;
  int64_t n_anchor_total = 0;
  int64_t n_residual_total = 0;
  CompressionStats stats;  // of the last compression

  bool compressed() const { return !segments.empty(); }
  bool streaming() const { return config.segment_tokens > 0; }
  int64_t compressed_tokens() const {
    return segments.empty() ? 0 : segments.back().pos0 + segments.back().tokens - head.tokens;
  }
  int64_t tokens_per_row() const { return head.tokens + compressed_tokens() + tail.tokens; }
  // Sum of the sizes of every buffer the cache holds for K/V.
  int64_t buffer_bytes() const;
};

// The state of `cache` read without its lock: for single-threaded tests only.
const AnchorKVState& unlocked_state(const AnchorKVCache& cache);

}  // namespace anchorkv::internal
