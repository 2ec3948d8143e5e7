// The stored state of an AnchorKVCache, visible to the library's own kernels
// and tests. Each (batch, head) row is, in position order:
//   head     exact fp16 tokens stored before the compressed segment
//            (S == 1 calls that came before the prefill, seed behaviour)
//   segment  the compressed prefill (one CompressedRow per row), if any
//   tail     exact fp16 tokens appended after it (decode)
#pragma once

#include <memory>
#include <vector>

#include "anchorkv/cache.h"
#include "cache/input.h"
#include "compress/codec.h"
#include "compress/segment.h"

namespace anchorkv::internal {

struct AnchorKVState {
  AnchorKVConfig config;
  cache::ExactRows head, tail;
  std::vector<compress::CompressedRow> segment;  // [B * H] or empty
  std::vector<std::vector<int64_t>> segment_slots;  // [B * H] compress::residual_slot_index of each row
  std::vector<std::vector<int32_t>> segment_anchor_pos;  // [B * H] anchor_positions() of seed-layout rows
  int64_t segment_tokens = 0;                    // per row
  std::shared_ptr<const compress::ResidualCodec> codec;
  bool seen_prefill_call = false;  // a call with S > 1 happened
  // Observation queries given with the call that last appended to the head
  // (its last positions); compress_head scores with them. Not saved in cache
  // files: a head restored from a file compresses with proxy keys.
  cache::ObservationQueries head_queries;

  // Seed accounting, updated at each change.
  int64_t segment_bytes = 0;  // sum over rows of docs/spec.md §5 formula
  int64_t n_anchor_total = 0;
  int64_t n_residual_total = 0;
  CompressionStats stats;  // of the last compression

  bool compressed() const { return !segment.empty(); }
  int64_t tokens_per_row() const { return head.tokens + segment_tokens + tail.tokens; }
  // Sum of the sizes of every buffer the cache holds for K/V.
  int64_t buffer_bytes() const;
};

// The state of `cache` read without its lock: for single-threaded tests only.
const AnchorKVState& unlocked_state(const AnchorKVCache& cache);

}  // namespace anchorkv::internal
