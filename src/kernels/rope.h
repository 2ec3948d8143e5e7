// Rotary position embedding helpers for pre-RoPE attention.
//   pair i of a vector: (x, y) = (v[ix(i)], v[iy(i)]), angle p * theta_i with
//   theta_i = base^(-2i / D); rotation (x, y) -> (x c - y s, x s + y c).
#pragma once

#include <cstdint>

#include "anchorkv/attention.h"

namespace anchorkv::kernels {

inline int64_t rope_x(RopeStyle style, int64_t i, int64_t /*D*/) { return style == RopeStyle::kNormal ? 2 * i : i; }
inline int64_t rope_y(RopeStyle style, int64_t i, int64_t D) {
  return style == RopeStyle::kNormal ? 2 * i + 1 : i + D / 2;
}

// cos/sin of p * theta_i for p = pos0 .. pos0 + n - 1, i < D/2: [n, D/2] each.
// Exact sincos at pos0, then the angle-addition recurrence in double.
void rope_table(int64_t pos0, int64_t n, int64_t D, double base, float* cos_out, float* sin_out);

// Rotate x [D] in place by the angles of one table row (inverse: by minus them).
void rope_rotate(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse = false);

// Rotate x [D] in place by position p (exact sincos; for a handful of vectors).
void rope_rotate_at(float* x, int64_t D, const RopeOptions& rope, int64_t p, bool inverse = false);

}  // namespace anchorkv::kernels
