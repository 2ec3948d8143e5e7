#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <mutex>
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

std::shared_ptr<const RopeTable> shared_rope_table(double base, int64_t D, int64_t n) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<const RopeTable>> tables;  // one per (base, D)
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<const RopeTable>* slot = nullptr;
  for (auto& t : tables)
    if (t->base == base && t->D == D) slot = &t;
  if (slot && (*slot)->n >= n) return *slot;
  auto t = std::make_shared<RopeTable>();
  t->base = base;
  t->D = D;
  const int64_t have = slot ? (*slot)->n : 0;
  t->n = std::max<int64_t>((n + kRopeBlock - 1) / kRopeBlock, 2 * have / kRopeBlock) * kRopeBlock;
  const int64_t half = D / 2;
  t->cos.resize(static_cast<size_t>(t->n * half));
  t->sin.resize(t->cos.size());
  if (slot) {
    std::copy((*slot)->cos.begin(), (*slot)->cos.end(), t->cos.begin());
    std::copy((*slot)->sin.begin(), (*slot)->sin.end(), t->sin.begin());
  }
  for (int64_t p0 = have; p0 < t->n; p0 += kRopeBlock)
    rope_table(p0, kRopeBlock, D, base, &t->cos[static_cast<size_t>(p0 * half)],
               &t->sin[static_cast<size_t>(p0 * half)]);
  if (slot) {
    *slot = t;
  } else {
    if (tables.size() >= 8) tables.erase(tables.begin());  // a few (base, D) pairs per process
    tables.push_back(t);
  }
  return t;
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

void rope_pair_products(const float* q, int64_t nq, const float* a, int64_t k, int64_t D, RopeStyle style,
                        float* out) {
  const int64_t half = D / 2;
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t j = 0; j < k; ++j) {
      const float* qg = q + g * D;
      const float* aj = a + j * D;
      float* o = out + (g * k + j) * D;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t x = rope_x(style, i, D), y = rope_y(style, i, D);
        o[i] = qg[x] * aj[x] + qg[y] * aj[y];
        o[half + i] = qg[y] * aj[x] - qg[x] * aj[y];
      }
    }
}

}  // namespace anchorkv::kernels
