#include "core/rotation.h"

#include <cmath>
#include <vector>

#include "core/linalg.h"
#include "core/rng.h"

namespace anchorkv::core {

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

void fwht(float* x, int64_t n) { fwht_simd(x, n); }

void fwht_ref(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t i = 0; i < n; i += h << 1) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

Rotation::Rotation(int64_t dim, uint64_t seed) : dim_(dim), hadamard_(is_power_of_two(dim)) {
  Rng rng(stream_seed(seed, 0x526F74ull /* "Rot" */));
  if (hadamard_) {
    signs_.resize(static_cast<size_t>(dim));
    for (auto& s : signs_) s = (rng.next() >> 63) ? -1.0f : 1.0f;
    return;
  }
  const int64_t n = dim;
  // cols[j] is column j of the matrix being orthonormalised.
  std::vector<double> cols(static_cast<size_t>(n * n));
  for (auto& v : cols) v = 2.0 * rng.uniform() - 1.0;
  for (int64_t j = 0; j < n; ++j) {
    double* cj = &cols[static_cast<size_t>(j * n)];
    for (int pass = 0; pass < 2; ++pass) {  // re-orthogonalise once for accuracy
      for (int64_t i = 0; i < j; ++i) {
        const double* ci = &cols[static_cast<size_t>(i * n)];
        double dot = 0;
        for (int64_t t = 0; t < n; ++t) dot += ci[t] * cj[t];
        for (int64_t t = 0; t < n; ++t) cj[t] -= dot * ci[t];
      }
    }
    double norm = 0;
    for (int64_t t = 0; t < n; ++t) norm += cj[t] * cj[t];
    norm = std::sqrt(norm);
    for (int64_t t = 0; t < n; ++t) cj[t] /= norm;
  }
  // R = Q^T would also be orthogonal; we use R[r][c] = column r's entry c, i.e. rows of R are
  // the orthonormal vectors.
  matrix_.resize(static_cast<size_t>(n * n));
  for (size_t i = 0; i < matrix_.size(); ++i) matrix_[i] = static_cast<float>(cols[i]);
}

void Rotation::forward(const float* x, float* out) const {
  const int64_t n = dim_;
  if (hadamard_) {
    const float norm = 1.0f / std::sqrt(static_cast<float>(n));
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * signs_[i];
    fwht(out, n);
    for (int64_t i = 0; i < n; ++i) out[i] *= norm;
    return;
  }
  std::vector<float> tmp(x, x + n);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = &matrix_[static_cast<size_t>(r * n)];
    float acc = 0;
    for (int64_t c = 0; c < n; ++c) acc += row[c] * tmp[c];
    out[r] = acc;
  }
}

void Rotation::inverse(const float* y, float* out) const {
  const int64_t n = dim_;
  if (hadamard_) {
    const float norm = 1.0f / std::sqrt(static_cast<float>(n));
    if (out != y)
      for (int64_t i = 0; i < n; ++i) out[i] = y[i];
    fwht(out, n);
    for (int64_t i = 0; i < n; ++i) out[i] *= norm * signs_[i];
    return;
  }
  std::vector<float> tmp(y, y + n);
  for (int64_t c = 0; c < n; ++c) out[c] = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = &matrix_[static_cast<size_t>(r * n)];
    const float yr = tmp[r];
    for (int64_t c = 0; c < n; ++c) out[c] += row[c] * yr;
  }
}

}  // namespace anchorkv::core
