// Streaming AnchorKV (docs/spec.md §4.8): every call appends to the exact
// tail, and the tail's oldest segment_tokens close into a compressed segment
// once it holds recent_tokens + segment_tokens. A multi-token call (a prompt,
// a chunk) closes its segments at once, up to 16 segment_tokens each. A decode step that fills a segment
// compresses it on a background worker and leaves its tokens exact until the
// step that brings the tail to recent + segment + lag tokens, which commits it
// (waiting if it is not done): where segments close never depends on timing,
// so the bits do not either, and no decode step pays for a whole compression.
#pragma once

#include "cache/anchorkv_state.h"
#include "cache/input.h"
#include "cache/store.h"

namespace anchorkv::internal {

// Decode steps a segment compressing off the path has before it must commit.
int64_t close_lag(const AnchorKVConfig& cfg);
// The longest segment a multi-token call closes (16 segment_tokens).
int64_t prompt_segment_tokens(const AnchorKVConfig& cfg);

// Stores a validated call (strong guarantee: throws with no change).
void store_streaming(AnchorKVState& st, const cache::StagedInput& in, const CacheShape& shape);

// compress_now() of a streaming cache: commits a segment closing off the path,
// then closes the whole exact tail as one segment. Throws
// Error(kInvalidState, op) when no exact token is left.
void close_tail(AnchorKVState& st, const CacheShape& shape, const char* op);

}  // namespace anchorkv::internal
