// Assignment and projection (docs/spec.md §4.2), one side (K or V) of one row.
//   a(t)  = argmax_a |<x_t, x_a>| / (||x_t|| ||x_a|| + 1e-12)   (ties: lower anchor ordinal)
//   gamma = <x_t, x_a(t)> / (||x_a(t)||^2 + 1e-12)
//   r_t   = x_t - gamma * x_a(t)
// Anchors map to themselves with gamma = 1 (r = 0).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace anchorkv::compress {

inline constexpr float kAssignEps = 1e-12f;

struct SideAssignment {
  std::vector<int32_t> anchor;  // [S] ordinal into the sorted anchor list
  std::vector<float> coef;      // [S] gamma
};

// The rows a side's tokens may be approximated by, [n, D]: the anchors of
// the segment being extended (its table, compress/segment.h extend_row), then
// the segment's own anchors in position order. Ordinals index this table.
std::vector<float> anchor_table(const float* X, int64_t D, std::span<const int32_t> anchors,
                                const float* prior, int64_t n_prior);

// X: [S, D] row-major. anchors: sorted positions; prior [n_prior, D] the
// anchors of the segment being extended (anchor_table), none by default.
SideAssignment assign_reference(const float* X, int64_t S, int64_t D, std::span<const int32_t> anchors,
                                const float* prior = nullptr, int64_t n_prior = 0);

// Pick the anchor from precomputed dot products (shared by both paths):
// dots[j] = <x, a_j>, anchor_norms[j] = ||a_j||, anchor_sq[j] = ||a_j||^2.
// The reference scans with core::abs_cosine_argmax_ref; `simd` selects the
// SIMD scan, which returns the same index.
void choose_anchor(const float* dots, int64_t n_anchor, float token_norm, const float* anchor_norms,
                   const float* anchor_sq, int32_t* anchor_out, float* coef_out, bool simd = false);

// r = x - gamma * a
inline void residual(const float* x, const float* a, float gamma, int64_t D, float* r) {
  for (int64_t d = 0; d < D; ++d) r[d] = x[d] - gamma * a[d];
}

}  // namespace anchorkv::compress
