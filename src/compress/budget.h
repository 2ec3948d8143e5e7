// Byte budget (docs/spec.md §4.4, paper Eq. 9) and residual allocation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "anchorkv/config.h"
#include "compress/row_layout.h"

namespace anchorkv::compress {

// One residual: packed codes + one fp16 scale.
inline int64_t residual_bytes(int64_t D, int bits) { return (D * bits + 7) / 8 + 2; }
// fp16 K + V of a row.
inline int64_t full_row_bytes(int64_t S, int64_t D) { return S * D * 2 * 2; }
// fp16 anchors (K and V) + metadata of the other tokens and anchors + per-row
// bytes, as the row's layout stores them (compress/row_layout.h).
inline int64_t base_row_bytes(int64_t S, int64_t n_anchor, int64_t D, MetadataLayout layout = MetadataLayout::kSeed) {
  return with_layout(layout, [&](auto L) {
    return n_anchor * (D * 2 * 2 + L.kAnchorBytes) + (S - n_anchor) * L.kEntryBytes + 2 * L.kSideBytes;
  });
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
