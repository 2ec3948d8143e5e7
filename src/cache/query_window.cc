#include "cache/query_window.h"

#include <algorithm>

namespace anchorkv::cache {

QueryWindow::QueryWindow(int64_t rows, int64_t G, int64_t D, int64_t capacity)
    : groups_(rows * G),
      G_(G),
      D_(D),
      capacity_(capacity),
      ring_(static_cast<size_t>(capacity * rows * G * D)) {}

void QueryWindow::push(const ObservationQueries& q) noexcept {
  const int64_t n = std::min(q.W, capacity_), first = q.W - n;
  for (int64_t j = 0; j < n; ++j) {
    float* slot = &ring_[static_cast<size_t>(next_ * groups_ * D_)];
    for (int64_t g = 0; g < groups_; ++g)
      std::copy_n(&q.q[static_cast<size_t>((g * q.W + first + j) * D_)], D_, slot + g * D_);
    next_ = (next_ + 1) % capacity_;
  }
  count_ = std::min(capacity_, count_ + n);
}

ObservationQueries QueryWindow::ordered() const {
  ObservationQueries out;
  if (empty()) return out;
  out.G = G_;
  out.W = count_;
  out.D = D_;
  out.q.resize(static_cast<size_t>(groups_ * count_ * D_));
  const int64_t oldest = (next_ - count_ + capacity_) % capacity_;
  for (int64_t j = 0; j < count_; ++j) {
    const float* slot = &ring_[static_cast<size_t>(((oldest + j) % capacity_) * groups_ * D_)];
    for (int64_t g = 0; g < groups_; ++g)
      std::copy_n(slot + g * D_, D_, &out.q[static_cast<size_t>((g * count_ + j) * D_)]);
  }
  return out;
}

}  // namespace anchorkv::cache
