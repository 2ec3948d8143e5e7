// Seeded orthogonal transform R for the residual codec (docs/spec.md §4.5).
//
// D a power of two: R = H_D * diag(s) / sqrt(D), s_i = +-1 from the seed
//   (random signs, then the normalized fast Walsh-Hadamard transform).
// Any other D: R = Q, a dense orthogonal D x D matrix, Q = the modified
//   Gram-Schmidt orthonormalisation (in double) of a matrix whose entries are
//   uniform in [-1, 1) from Rng(seed), columns in order. Applying it costs D^2.
// Both are exactly orthogonal up to rounding: ||R x|| = ||x||, R^T R = I.
#pragma once

#include <cstdint>
#include <vector>

namespace anchorkv::core {

bool is_power_of_two(int64_t n);

// In-place unnormalized fast Walsh-Hadamard transform, n a power of two:
// fwht dispatches to the SIMD form (core/linalg.h), fwht_ref is its scalar
// twin; the two give identical bits.
void fwht(float* x, int64_t n);
void fwht_ref(float* x, int64_t n);

class Rotation {
 public:
  Rotation() = default;
  Rotation(int64_t dim, uint64_t seed);

  int64_t dim() const { return dim_; }
  bool is_hadamard() const { return hadamard_; }
  // The Hadamard form's random signs [D] (empty for the dense form): inverse
  // is signs * fwht(y) / sqrt(D).
  const std::vector<float>& signs() const { return signs_; }
  // out = R x  (in and out may alias)
  void forward(const float* x, float* out) const;
  // out = R^T y (in and out may alias)
  void inverse(const float* y, float* out) const;

 private:
  int64_t dim_ = 0;
  bool hadamard_ = false;
  std::vector<float> signs_;   // [D] for the Hadamard form
  std::vector<float> matrix_;  // [D, D] row-major for the dense form
};

}  // namespace anchorkv::core
