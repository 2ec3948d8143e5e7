#include "core/rope.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <mutex>
#include <vector>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// rope_rotate over whole vectors of pairs; returns the pairs done (the caller
// finishes the rest). Adjacent pairs (normal style) are split into x and y
// lanes with LoadInterleaved2, split halves (NeoX) are contiguous already.
int64_t RopeRotatePairs(float* HWY_RESTRICT x, int64_t D, int neox, const float* HWY_RESTRICT c,
                        const float* HWY_RESTRICT s, int inverse) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), half = D / 2;
  int64_t i = 0;
  for (; i + N <= half; i += N) {
    const auto vc = hn::LoadU(d, c + i);
    const auto vs = inverse ? hn::Neg(hn::LoadU(d, s + i)) : hn::LoadU(d, s + i);
    auto xa = hn::Zero(d), xb = hn::Zero(d);
    if (neox) {
      xa = hn::LoadU(d, x + i);
      xb = hn::LoadU(d, x + half + i);
    } else {
      hn::LoadInterleaved2(d, x + 2 * i, xa, xb);
    }
    hn::Vec<decltype(d)> ra, rb;
    RotatePairs(xa, xb, vc, vs, ra, rb);
    if (neox) {
      hn::StoreU(ra, d, x + i);
      hn::StoreU(rb, d, x + half + i);
    } else {
      hn::StoreInterleaved2(ra, rb, d, x + 2 * i);
    }
  }
  return i;
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::core {
HWY_EXPORT(RopeRotatePairs);

std::string rope_problem(const RopeOptions& rope, int64_t D) {
  if (D <= 0 || D % 2 != 0) return "RoPE needs an even head dim D";
  if (!(rope.base > 1.0) || !std::isfinite(rope.base)) return "rope.base must be finite and > 1";
  if (rope.style != RopeStyle::kNormal && rope.style != RopeStyle::kNeox) return "rope.style is unknown";
  if (!rope.freq_scale.empty() && static_cast<int64_t>(rope.freq_scale.size()) != D / 2)
    return "rope.freq_scale has " + std::to_string(rope.freq_scale.size()) + " values for " + std::to_string(D / 2) +
           " pairs";
  for (double f : rope.freq_scale)
    if (!(f > 0.0) || !std::isfinite(f)) return "rope.freq_scale values must be finite and > 0";
  return "";
}

std::vector<double> rope_thetas(const RopeOptions& rope, int64_t D) {
  const int64_t half = D / 2;
  std::vector<double> theta(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    theta[i] = std::pow(rope.base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    if (!rope.freq_scale.empty()) theta[i] *= rope.freq_scale[static_cast<size_t>(i)];
  }
  return theta;
}

bool same_angles(const RopeOptions& a, const RopeOptions& b) {
  return a.base == b.base && a.freq_scale == b.freq_scale;
}

void rope_table(int64_t pos0, int64_t n, int64_t D, const RopeOptions& rope, float* cos_out, float* sin_out,
                int64_t stride) {
  const int64_t half = D / 2;
  const std::vector<double> thetas = rope_thetas(rope, D);
  std::vector<double> c(static_cast<size_t>(half)), s(c.size()), dc(c.size()), ds(c.size());
  for (int64_t i = 0; i < half; ++i) {
    const double theta = thetas[static_cast<size_t>(i)];
    c[i] = std::cos(static_cast<double>(pos0) * theta);
    s[i] = std::sin(static_cast<double>(pos0) * theta);
    dc[i] = std::cos(static_cast<double>(stride) * theta);
    ds[i] = std::sin(static_cast<double>(stride) * theta);
  }
  // Row by row, the pairs side by side: the recurrence of one pair is a
  // chain of dependent multiplies, and the pairs of a row fill the vector
  // units (pair by pair, building a 32k-position table of every row added
  // ~6 ms to the decode step that first needed it).
  for (int64_t t = 0; t < n; ++t) {
    float* co = cos_out + t * half;
    float* so = sin_out + t * half;
    for (int64_t i = 0; i < half; ++i) {
      co[i] = static_cast<float>(c[i]);
      so[i] = static_cast<float>(s[i]);
      const double nc = c[i] * dc[i] - s[i] * ds[i];
      s[i] = s[i] * dc[i] + c[i] * ds[i];
      c[i] = nc;
    }
  }
}

namespace {
// The step and near rows whose angle sum is position p.
struct RowPair {
  const float *bc, *bs, *jc, *js;
};
RowPair rows_of(const RopeTable& t, int64_t p) {
  assert(p >= 0 && p < t.n);
  const size_t half = static_cast<size_t>(t.D / 2);
  const size_t b = static_cast<size_t>(p / kRopeStep) * half, j = static_cast<size_t>(p % kRopeStep) * half;
  return {&t.step_cos[b], &t.step_sin[b], &t.near_cos[j], &t.near_sin[j]};
}
}  // namespace

void RopeTable::angles(int64_t p, float* c, float* s) const {
  const RowPair r = rows_of(*this, p);
  for (int64_t i = 0; i < D / 2; ++i) {
    c[i] = r.bc[i] * r.jc[i] - r.bs[i] * r.js[i];
    s[i] = r.bs[i] * r.jc[i] + r.bc[i] * r.js[i];
  }
}

void RopeTable::rotate(float* x, RopeStyle style, int64_t p, bool inverse) const {
  const RowPair r = rows_of(*this, p);
  rope_rotate(x, D, style, r.jc, r.js, inverse);
  rope_rotate(x, D, style, r.bc, r.bs, inverse);
}

std::shared_ptr<const RopeTable> shared_rope_table(const RopeOptions& rope, int64_t D, int64_t n) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<const RopeTable>> tables;  // one per (angles, D)
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<const RopeTable>* slot = nullptr;
  for (auto& t : tables)
    if (same_angles(t->rope, rope) && t->D == D) slot = &t;
  if (slot && (*slot)->n >= n) return *slot;
  auto t = slot ? std::make_shared<RopeTable>(**slot) : std::make_shared<RopeTable>();
  const int64_t half = D / 2, have = slot ? (*slot)->n : 0;
  t->rope.base = rope.base;
  t->rope.freq_scale = rope.freq_scale;
  t->D = D;
  t->n = (std::max<int64_t>(n, 1) + kRopeBlock - 1) / kRopeBlock * kRopeBlock;
  if (!slot) {
    t->near_cos.resize(static_cast<size_t>(kRopeStep * half));
    t->near_sin.resize(t->near_cos.size());
    rope_table(0, kRopeStep, D, rope, t->near_cos.data(), t->near_sin.data());
  }
  t->step_cos.resize(static_cast<size_t>(t->n / kRopeStep * half));
  t->step_sin.resize(t->step_cos.size());
  for (int64_t p0 = have; p0 < t->n; p0 += kRopeBlock) {
    const size_t row = static_cast<size_t>(p0 / kRopeStep * half);
    rope_table(p0, kRopeBlock / kRopeStep, D, rope, &t->step_cos[row], &t->step_sin[row], kRopeStep);
  }
  if (slot) {
    *slot = t;
  } else {
    if (tables.size() >= 8) tables.erase(tables.begin());  // a few (angles, D) pairs per process
    tables.push_back(t);
  }
  return t;
}

namespace {
// Pairs [i0, D/2) one at a time: the reference, and the tail of the SIMD path.
void rope_rotate_from(int64_t i0, float* x, int64_t D, RopeStyle style, const float* c, const float* s,
                      bool inverse) {
  for (int64_t i = i0; i < D / 2; ++i) {
    const int64_t a = rope_x(style, i, D), b = rope_y(style, i, D);
    const float sn = inverse ? -s[i] : s[i];
    const float xa = x[a], xb = x[b];
    x[a] = xa * c[i] - xb * sn;
    x[b] = xa * sn + xb * c[i];
  }
}
}  // namespace

void rope_rotate_ref(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse) {
  rope_rotate_from(0, x, D, style, c, s, inverse);
}

void rope_rotate(float* x, int64_t D, RopeStyle style, const float* c, const float* s, bool inverse) {
  const int64_t done = HWY_DYNAMIC_DISPATCH(RopeRotatePairs)(x, D, style == RopeStyle::kNeox, c, s, inverse);
  rope_rotate_from(done, x, D, style, c, s, inverse);
}

void rope_rotate_at(float* x, int64_t D, const RopeOptions& rope, int64_t p, bool inverse) {
  std::vector<float> c(static_cast<size_t>(D / 2)), s(c.size());
  rope_table(p, 1, D, rope, c.data(), s.data());
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

namespace {
template <class T>
void split_pairs(const T* x, int64_t D, RopeStyle style, T* out) {
  for (int64_t i = 0; i < D / 2; ++i) {
    out[i] = x[rope_x(style, i, D)];
    out[D / 2 + i] = x[rope_y(style, i, D)];
  }
}
}  // namespace

void rope_split(const float* x, int64_t D, RopeStyle style, float* out) { split_pairs(x, D, style, out); }
void rope_split(const uint16_t* x, int64_t D, RopeStyle style, uint16_t* out) {
  split_pairs(x, D, style, out);
}

}  // namespace anchorkv::core
#endif  // HWY_ONCE
