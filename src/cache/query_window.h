// The observation queries of a streaming AnchorKV cache's newest positions:
// a ring of the last `capacity` positions' queries per row and query head.
// A decode step adds one position; copying the whole window each step (as a
// [rows, G, W, D] block must be re-laid to grow) would cost rows * G * W * D
// floats per layer and token, so positions are kept outermost and put in
// order only when a segment closes.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/input.h"

namespace anchorkv::cache {

class QueryWindow {
 public:
  QueryWindow() = default;
  // An empty window for `rows` rows of G query heads of dim D (allocates; may throw).
  QueryWindow(int64_t rows, int64_t G, int64_t D, int64_t capacity);

  bool empty() const { return count_ == 0; }
  int64_t size() const { return count_; }
  // Whether `q` (a call's queries for `rows` rows) can be pushed without a new window.
  bool fits(const ObservationQueries& q, int64_t rows) const {
    return capacity_ > 0 && q.G == G_ && q.D == D_ && rows * q.G == groups_;
  }
  // Adds q's last min(q.W, capacity) positions, dropping the oldest (needs fits()).
  void push(const ObservationQueries& q) noexcept;
  // The window as ObservationQueries [rows, G, size(), D], oldest first (empty when empty()).
  ObservationQueries ordered() const;

 private:
  int64_t groups_ = 0, G_ = 0, D_ = 0, capacity_ = 0;  // groups_ = rows * G
  int64_t count_ = 0, next_ = 0;                       // positions held, slot the next one takes
  std::vector<float> ring_;                            // [capacity, groups, D]
};

}  // namespace anchorkv::cache
