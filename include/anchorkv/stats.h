// What a compression reports about itself (AnchorKVCache::last_compression_stats).
#pragma once

#include <cstdint>

namespace anchorkv {

// Per-stage wall time of the last compression, seconds.
struct CompressionStats {
  // Stage times sum over every anchor count tried (anchor_count = auto tries
  // several), but for the observation, which they share.
  double scores_s = 0;    // observation logits + softmax + observation outputs y_w
  double anchors_s = 0;   // anchor selection + anchor tables
  double assign_s = 0;    // assignment, projection, residual utilities
  double allocate_s = 0;  // budget and top-N allocation
  double encode_s = 0;    // residual codec
  double total_s = 0;
  int64_t rows = 0;    // (batch, head) rows compressed
  int64_t tokens = 0;  // tokens per row
  int64_t anchor_counts_tried = 0;  // 1 unless anchor_count = auto
};

}  // namespace anchorkv
