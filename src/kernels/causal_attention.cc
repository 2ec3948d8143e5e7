// Blocked causal self-attention (causal_attention.h). Per (head, query block)
// task: scores of the block against each key block up to the diagonal as a
// matrix product with K transposed (core::matmul_nn: outer products, no
// horizontal sums), an online softmax (running max and normaliser per query,
// the accumulator rescaled when the max grows), values as the product of the
// probabilities with V's rows.
#include "kernels/causal_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/convert.h"
#include "core/half.h"
#include "core/linalg.h"
#include "core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/causal_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// s[0, n) -> exp(s - m_new) in place, where m_new = max(m, max s); updates m
// and l (l = l * exp(m - m_new) + sum) and returns the factor exp(m - m_new)
// that rescales what was accumulated before.
float SoftmaxUpdate(float* HWY_RESTRICT s, int64_t n, float* m, float* l) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float m_new = std::max(*m, core::HWY_NAMESPACE::MaxSpan(d, s, n));
  if (m_new == -HUGE_VALF) {  // nothing visible yet
    std::fill_n(s, n, 0.0f);
    return 1.0f;
  }
  const auto vm = hn::Set(d, m_new);
  auto sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = core::HWY_NAMESPACE::ExpNonPositive(d, hn::Sub(hn::LoadU(d, s + i), vm));
    hn::StoreU(e, d, s + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) {
    s[i] = s[i] == -HUGE_VALF ? 0.0f : std::exp(s[i] - m_new);
    total += s[i];
  }
  const float alpha = *m == -HUGE_VALF ? 0.0f : std::exp(*m - m_new);
  *m = m_new;
  *l = *l * alpha + total;
  return alpha;
}

// acc = acc * alpha + add, over n floats.
void ScaleAdd(float* HWY_RESTRICT acc, float alpha, const float* HWY_RESTRICT add, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i), va, hn::LoadU(d, add + i)), d, acc + i);
  for (; i < n; ++i) acc[i] = acc[i] * alpha + add[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::kernels {
HWY_EXPORT(SoftmaxUpdate);
HWY_EXPORT(ScaleAdd);

namespace {
// Queries and keys per block: a block's scores (64 x 64) and accumulators
// (64 x hd) stay in L1/L2 while the key block streams by.
constexpr int64_t kBlock = 64;

struct BlockScratch {
  std::vector<float> q, s, acc, pv, m, l, alpha;
};

// The keys query i of a chunk attends: [first, last] (causal_attention.h).
struct Visible {
  int64_t before, window;  // keys before the chunk; 0: no window
  int64_t last(int64_t i) const { return before + i; }
  int64_t first(int64_t i) const { return window > 0 ? std::max<int64_t>(0, before + i - window + 1) : 0; }
};

// Query block [t0, t0 + nq) of head h against the keys it sees; kt is the
// head's keys transposed [hd, N], v16 its values [N, hd].
void query_block(const float* q, const float* kt, const float* v16, int64_t N, int64_t hd, float scale,
                 const Visible& vis, int64_t t0, int64_t nq, float* out, BlockScratch& w) {
  w.q.resize(static_cast<size_t>(kBlock * hd));
  w.s.resize(static_cast<size_t>(kBlock * kBlock));
  w.acc.assign(static_cast<size_t>(kBlock * hd), 0.0f);
  w.pv.resize(static_cast<size_t>(kBlock * hd));
  w.m.assign(kBlock, -HUGE_VALF);
  w.l.assign(kBlock, 0.0f);
  w.alpha.resize(kBlock);
  for (int64_t i = 0; i < nq * hd; ++i) w.q[static_cast<size_t>(i)] = q[t0 * hd + i] * scale;
  const int64_t end = vis.last(t0 + nq - 1) + 1;
  for (int64_t k0 = vis.first(t0); k0 < end; k0 += kBlock) {
    const int64_t nk = std::min(kBlock, end - k0);
    core::matmul_nn(w.q.data(), nq, hd, kt + k0, N, hd, nk, w.s.data(), kBlock);
    for (int64_t i = 0; i < nq; ++i) {
      float* s = &w.s[static_cast<size_t>(i * kBlock)];
      const int64_t lo = vis.first(t0 + i) - k0, hi = vis.last(t0 + i) - k0;  // visible: [lo, hi]
      for (int64_t j = 0; j < std::min(lo, nk); ++j) s[j] = -HUGE_VALF;    // out of the window
      for (int64_t j = std::max<int64_t>(0, hi + 1); j < nk; ++j) s[j] = -HUGE_VALF;  // future keys
      w.alpha[static_cast<size_t>(i)] = HWY_DYNAMIC_DISPATCH(SoftmaxUpdate)(
          s, nk, &w.m[static_cast<size_t>(i)], &w.l[static_cast<size_t>(i)]);
    }
    // pv[i, d] = sum_j p[i, j] v[k0 + j, d]
    core::matmul_nn(w.s.data(), nq, kBlock, v16 + k0 * hd, hd, nk, hd, w.pv.data(), hd);
    for (int64_t i = 0; i < nq; ++i)  // acc = acc * alpha + pv, row by row
      HWY_DYNAMIC_DISPATCH(ScaleAdd)
      (&w.acc[static_cast<size_t>(i * hd)], w.alpha[static_cast<size_t>(i)],
       &w.pv[static_cast<size_t>(i * hd)], hd);
  }
  for (int64_t i = 0; i < nq; ++i) {
    const float inv = 1.0f / w.l[static_cast<size_t>(i)];
    for (int64_t d = 0; d < hd; ++d) out[(t0 + i) * hd + d] = w.acc[static_cast<size_t>(i * hd + d)] * inv;
  }
}
}  // namespace

void causal_attention(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T,
                      int64_t hd, float scale, float* out, int threads) {
  causal_attention(q, k, v, Hq, Hk, T, T, hd, scale, 0, out, threads);
}

void causal_attention(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T, int64_t N,
                      int64_t hd, float scale, int64_t window, float* out, int threads) {
  if (Hq <= 0 || Hk <= 0 || T <= 0 || N < T || hd <= 0) return;
  const int64_t group = Hq / Hk, kv = Hk * N * hd;
  // K and V rounded to fp16 as the cache holds them; K transposed per head.
  std::vector<float> k16(static_cast<size_t>(kv)), v16(static_cast<size_t>(kv)), kt(static_cast<size_t>(kv));
  core::round_to_f16_n(k, k16.data(), kv);
  core::round_to_f16_n(v, v16.data(), kv);
  constexpr int64_t kTile = 32;  // transposed in tiles that stay in L1
  const int64_t tiles = (N + kTile - 1) / kTile;
  core::parallel_for(Hk * tiles, threads, [&](int64_t task) {
    const int64_t h = task / tiles, t0 = task % tiles * kTile;
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t t = t0; t < std::min(N, t0 + kTile); ++t)
        kt[static_cast<size_t>((h * hd + d) * N + t)] = k16[static_cast<size_t>((h * N + t) * hd + d)];
  });
  // Tasks from the last query blocks (the most keys) to the first, so the
  // long ones start early and the short ones fill the end.
  const Visible vis{N - T, window};
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  core::parallel_for(Hq * blocks, threads, [&](int64_t task) {
    thread_local BlockScratch w;
    const int64_t b = blocks - 1 - task / Hq, h = task % Hq, kh = h / group;
    const int64_t t0 = b * kBlock;
    query_block(q + h * T * hd, &kt[static_cast<size_t>(kh * hd * N)], &v16[static_cast<size_t>(kh * N * hd)], N,
                hd, scale, vis, t0, std::min(kBlock, T - t0), out + h * T * hd, w);
  });
}

void causal_attention_ref(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T,
                          int64_t N, int64_t hd, float scale, int64_t window, float* out) {
  const int64_t group = Hq / Hk;
  const Visible vis{N - T, window};
  auto f16 = [](float x) { return core::half_to_float(core::float_to_half(x)); };
  std::vector<double> s;
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const float* qi = q + (h * T + i) * hd;
      const float* kh = k + h / group * N * hd;
      const float* vh = v + h / group * N * hd;
      const int64_t lo = vis.first(i), hi = vis.last(i);
      s.assign(static_cast<size_t>(hi - lo + 1), 0.0);
      double mx = -HUGE_VAL, sum = 0;
      for (int64_t j = lo; j <= hi; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qi[d] * scale) * f16(kh[j * hd + d]);
        s[static_cast<size_t>(j - lo)] = dot;
        mx = std::max(mx, dot);
      }
      for (double& x : s) sum += x = std::exp(x - mx);
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (int64_t j = lo; j <= hi; ++j) acc += s[static_cast<size_t>(j - lo)] * f16(vh[j * hd + d]);
        out[(h * T + i) * hd + d] = static_cast<float>(acc / sum);
      }
    }
}

}  // namespace anchorkv::kernels
#endif  // HWY_ONCE
