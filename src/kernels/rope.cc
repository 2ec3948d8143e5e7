#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace anchorkv::kernels {

void rope_table(int64_t pos0, int64_t n, int64_t D, double base, float* cos_out, float* sin_out) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    double c = std::cos(static_cast<double>(pos0) * theta), s = std::sin(static_cast<double>(pos0) * theta);
    const double dc = std::cos(theta), ds = std::sin(theta);
    for (int64_t t = 0; t < n; ++t) {
      cos_out[t * half + i] = static_cast<float>(c);
      sin_out[t * half + i] = static_cast<float>(s);
      const double nc = c * dc - s * ds;
      s = s * dc + c * ds;
      c = nc;
    }
  }
}

void rope_rotate(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse) {
  for (int64_t i = 0; i < D / 2; ++i) {
    const int64_t a = rope_x(style, i, D), b = rope_y(style, i, D);
    const float sn = inverse ? -s[i] : s[i];
    const float xa = x[a], xb = x[b];
    x[a] = xa * c[i] - xb * sn;
    x[b] = xa * sn + xb * c[i];
  }
}

void rope_rotate_at(float* x, int64_t D, const RopeOptions& rope, int64_t p, bool inverse) {
  std::vector<float> c(static_cast<size_t>(D / 2)), s(c.size());
  rope_table(p, 1, D, rope.base, c.data(), s.data());
  rope_rotate(x, D, rope.style, c.data(), s.data(), inverse);
}

}  // namespace anchorkv::kernels
