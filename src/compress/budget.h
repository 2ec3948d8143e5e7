// Byte budget (docs/spec.md §4.4, paper Eq. 9) and residual allocation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "anchorkv/config.h"

namespace anchorkv::compress {

// Seed metadata layout: per non-anchor token and side an int32-sized index
// word and an fp32 coefficient.
inline constexpr int64_t kMetaBytesPerToken = 2 * (4 + 4);

// One residual: packed codes + one fp16 scale.
inline int64_t residual_bytes(int64_t D, int bits) { return (D * bits + 7) / 8 + 2; }
// fp16 K + V of a row.
inline int64_t full_row_bytes(int64_t S, int64_t D) { return S * D * 2 * 2; }
// Compact layout: uint16 index + fp16 coefficient per side, plus an int32
// position per anchor.
inline constexpr int64_t kCompactMetaBytesPerToken = 2 * (2 + 2);
inline constexpr int64_t kCompactBytesPerAnchor = 4;
// Tight layout: a uint16 word for both sides' 7-bit indices and flags, one
// 8-bit coefficient per side; an int32 position per anchor; one coefficient
// exponent byte per side and row.
inline constexpr int64_t kTightMetaBytesPerToken = 2 + 1 + 1;
inline constexpr int64_t kTightBytesPerRow = 2;

// fp16 anchors (K and V) + metadata of the other tokens (+ per-row bytes).
inline int64_t base_row_bytes(int64_t S, int64_t n_anchor, int64_t D, MetadataLayout layout = MetadataLayout::kSeed) {
  const int64_t anchors = n_anchor * D * 2 * 2, others = S - n_anchor;
  switch (layout) {
    case MetadataLayout::kCompact:
      return anchors + n_anchor * kCompactBytesPerAnchor + others * kCompactMetaBytesPerToken;
    case MetadataLayout::kTight:
      return anchors + n_anchor * kCompactBytesPerAnchor + others * kTightMetaBytesPerToken + kTightBytesPerRow;
    default:
      return anchors + others * kMetaBytesPerToken;
  }
}
// max(0, floor((theta * full - base) / b_res)).
int64_t residual_budget(double theta, int64_t full, int64_t base, int64_t b_res);

struct BudgetSplit {
  int64_t keys = 0;    // floor(N / 2)
  int64_t values = 0;  // N - keys
};
inline BudgetSplit split_budget(int64_t n) { return {n / 2, n - n / 2}; }

// The `count` largest utilities over several rows (anchors carry -inf and are
// never chosen; so is NaN). Ties: lower row, then lower position. Returns the
// chosen positions of each row, ascending.
std::vector<std::vector<int32_t>> allocate_top(std::span<const std::span<const float>> utilities,
                                               int64_t count);

}  // namespace anchorkv::compress
