// Rotary position embedding helpers for pre-RoPE attention.
//   pair i of a vector: (x, y) = (v[ix(i)], v[iy(i)]), angle p * theta_i with
//   theta_i = base^(-2i / D) * freq_scale[i] (RopeOptions); rotation
//   (x, y) -> (x c - y s, x s + y c).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "anchorkv/config.h"
#include "core/buffer.h"

namespace anchorkv::core {

// The largest RoPE position attention and compression accept (angles stay
// accurate in float; tables stay within memory).
inline constexpr int64_t kMaxRopePosition = int64_t{1} << 24;

inline int64_t rope_x(RopeStyle style, int64_t i, int64_t /*D*/) {
  return style == RopeStyle::kNormal ? 2 * i : i;
}
inline int64_t rope_y(RopeStyle style, int64_t i, int64_t D) {
  return style == RopeStyle::kNormal ? 2 * i + 1 : i + D / 2;
}

// "" when `rope`'s angles are well defined for head dim D (an even D, a finite
// base > 1, a known style, freq_scale empty or D/2 finite values > 0), else
// what is wrong, for the caller's error message.
std::string rope_problem(const RopeOptions& rope, int64_t D);

// theta_i of `rope` (base and freq_scale) for i < D/2, in double.
std::vector<double> rope_thetas(const RopeOptions& rope, int64_t D);

// Whether a and b turn every pair alike (base and freq_scale; style and
// offset are not compared).
bool same_angles(const RopeOptions& a, const RopeOptions& b);

// cos/sin of p * theta_i for p = pos0, pos0 + stride, ... (n rows), i < D/2:
// [n, D/2] each, theta_i from `rope`'s base and freq_scale. Exact sincos at
// pos0, then the angle-addition recurrence in double.
void rope_table(int64_t pos0, int64_t n, int64_t D, const RopeOptions& rope, float* cos_out, float* sin_out,
                int64_t stride = 1);

// A position p = p0 + j with p0 a multiple of kRopeStep and j < kRopeStep:
// a kernel that needs many positions rotates its queries back by p0 once per
// block (a step row) and its keys by j (a near row, cache-resident) instead
// of reading one row per position. Step rows restart from exact sincos every
// kRopeBlock positions.
inline constexpr int64_t kRopeStep = 64;
inline constexpr int64_t kRopeBlock = 1024;

// cos/sin of p * theta_i for positions p in [0, n), shared by every attend()
// call with the same (angles, D): built once, extended in blocks of kRopeBlock
// positions, immutable once published. It holds only the rows of the first
// kRopeStep positions and of every kRopeStep-th position, 4 * D bytes per
// kRopeStep positions (a 128k context at D = 128: 1 MiB); any other row is
// their angle sum. A table of every row cost 64 MiB there, more than a
// compressed layer, and building it was most of the first decode step after
// a long prompt. Each step row is a function of (base, D, p) alone, never of
// how the table grew.
struct RopeTable {
  RopeOptions rope;  // base and freq_scale (the rest unused)
  int64_t D = 0, n = 0;
  // 64-byte aligned: the kernels load the rows as whole vectors (with the
  // near rows unaligned, pre-RoPE decode at 131072 took 13.4 ms, not 10.4).
  AlignedVector<float> near_cos, near_sin;  // [kRopeStep, D/2]: row j = position j
  AlignedVector<float> step_cos, step_sin;  // [n / kRopeStep, D/2]: row b = position b * kRopeStep
  // cos/sin of position p < n into c, s [D/2]: step row p / kRopeStep and
  // near row p mod kRopeStep by angle addition (within 1e-6 of exact
  // sincos, tested).
  void angles(int64_t p, float* c, float* s) const;
  // Rotate x [D] in place to position p < n (inverse: back from it): by the
  // near row, then by the step row.
  void rotate(float* x, RopeStyle style, int64_t p, bool inverse = false) const;
};
static_assert(kRopeBlock % kRopeStep == 0, "a table's length is a whole number of steps");
// A table covering at least [0, n). Thread-safe.
std::shared_ptr<const RopeTable> shared_rope_table(const RopeOptions& rope, int64_t D, int64_t n);

// Rotate x [D] in place by the angles of one table row (inverse: by minus them).
// SIMD over pairs; rope_rotate_ref is its scalar twin (equal up to fused
// multiply-add rounding).
void rope_rotate(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse = false);
void rope_rotate_ref(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse = false);

// Per query g and anchor j, the pair products that make q . RoPE_t(a) a dot
// with one table row: out [nq, k, D] = C_i = q_x a_x + q_y a_y (first D/2),
// S_i = q_y a_x - q_x a_y (last D/2), so q . RoPE_t(a) = sum_i C_i cos + S_i sin.
void rope_pair_products(const float* q, int64_t nq, const float* a, int64_t k, int64_t D, RopeStyle style,
                        float* out);

// x [D] with each RoPE pair's first coordinates first, then its second ones
// (out[i] = x[rope_x(i)], out[D/2 + i] = x[rope_y(i)]): a rotation is then
// (x, y) -> (x c - y s, x s + y c) on the two halves, and dot products are
// unchanged when both sides are split alike.
void rope_split(const float* x, int64_t D, RopeStyle style, float* out);
void rope_split(const uint16_t* x, int64_t D, RopeStyle style, uint16_t* out);  // fp16 bits, permuted alike

// Rotate x [D] in place by position p (exact sincos; for a handful of vectors).
void rope_rotate_at(float* x, int64_t D, const RopeOptions& rope, int64_t p, bool inverse = false);

// Rotations of many vectors to positions in [p0, p0 + n): angles from the
// shared table while it stays within 2n positions, else exact sincos per call
// (a far p0 would otherwise build a table of 4 * D * p0 / kRopeStep bytes).
class PositionRotator {
 public:
  PositionRotator(const RopeOptions& rope, int64_t D, int64_t p0, int64_t n)
      : rope_(rope), D_(D), table_(p0 <= n ? shared_rope_table(rope, D, p0 + n) : nullptr) {}
  void rotate(float* x, int64_t p, bool inverse = false) const {
    if (table_) return table_->rotate(x, rope_.style, p, inverse);
    rope_rotate_at(x, D_, rope_, p, inverse);
  }

 private:
  RopeOptions rope_;
  int64_t D_;
  std::shared_ptr<const RopeTable> table_;
};

}  // namespace anchorkv::core
