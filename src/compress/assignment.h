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

// The anchors a token may take: their table [n_anchor, D] (anchor_table),
// norms ||a_j|| and squares ||a_j||^2, in the reference's arithmetic
// (core::dot_ref) in both paths.
struct AnchorCandidates {
  const float* table;
  int64_t D, n_anchor;
  const float* norms;
  const float* sq;
};

// Picks token x's anchor from precomputed dot products dots[j] = <x, a_j>
// (shared by both paths). The reference scans with
// core::abs_cosine_near_max_ref; `simd` selects the SIMD scan. Where another
// anchor's cosine comes within the two paths' rounding of the best, both
// settle it by recomputing those cosines in the reference's arithmetic, so
// the fast path's dots (another summation order) pick the same anchor.
// gamma = <x, a> / (||a||^2 + eps) takes <x, a> from core::dot_fixed_order
// in both paths.
void choose_anchor(const AnchorCandidates& c, const float* x, const float* dots, float token_norm,
                   int32_t* anchor_out, float* coef_out, bool simd = false);

// r = x - gamma * a
inline void residual(const float* x, const float* a, float gamma, int64_t D, float* r) {
  for (int64_t d = 0; d < D; ++d) r[d] = x[d] - gamma * a[d];
}

}  // namespace anchorkv::compress
