// Attention kernels: scalar references and SIMD versions (Highway, dynamic
// dispatch) side by side. The compressed-row kernels are mostly gathers and
// scatters over per-token metadata; their exp runs through the same SIMD/scalar
// switch as the dense kernel.
#include "kernels/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/bitpack.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/half.h"
#include "core/linalg.h"
#include "kernels/rope.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// fp16 promotion and dot products shared with core (core/simd-inl.h).
HWY_INLINE void ToF32(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n) {
  core::HWY_NAMESPACE::F16ToF32Span(in, out, n);
}
HWY_INLINE float Dot(const float* HWY_RESTRICT x, const float* HWY_RESTRICT y, int64_t D) {
  return core::HWY_NAMESPACE::Dot1(DF(), x, y, D);
}

float ExpShiftSum(float* HWY_RESTRICT x, int64_t n, float m) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  if (i < n) {
    const auto mask = hn::FirstN(d, static_cast<size_t>(n - i));
    // Masked-off lanes read as -inf - m -> exp = 0.
    const auto v = hn::IfThenElse(mask, hn::MaskedLoad(mask, d, x + i), hn::Set(d, -HUGE_VALF));
    const auto e = hn::Exp(d, hn::Sub(v, vm));
    hn::BlendedStore(e, mask, d, x + i);
    sum = hn::Add(sum, hn::IfThenElseZero(mask, e));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// out[i] = scale[i] * table[idx[i]]: the anchor scores of n tokens (vector gathers).
void GatherScaled(const float* HWY_RESTRICT table, const int32_t* HWY_RESTRICT idx, const float* HWY_RESTRICT scale,
                  int64_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, scale + i), hn::GatherIndex(df, table, hn::LoadU(di, idx + i))), df, out + i);
  for (; i < n; ++i) out[i] = scale[i] * table[idx[i]];
}

// Per-anchor value weights across the query group: W[idx[i] * 4 + g] += P[i * 4 + g]
// for a group of 4 queries, one 4-lane add per token. Tokens alternate between two
// accumulators, so neighbours that share an anchor do not wait on each other.
void ScatterAdd4(const float* HWY_RESTRICT P, const int32_t* HWY_RESTRICT idx, int64_t n, float* HWY_RESTRICT W0,
                 float* HWY_RESTRICT W1) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) W0[idx[i] * 4 + g] += P[i * 4 + g];
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    float* a = W0 + idx[i] * 4;
    float* b = W1 + idx[i + 1] * 4;
    hn::StoreU(hn::Add(hn::LoadU(d4, a), hn::LoadU(d4, P + i * 4)), d4, a);
    hn::StoreU(hn::Add(hn::LoadU(d4, b), hn::LoadU(d4, P + i * 4 + 4)), d4, b);
  }
  for (; i < n; ++i) {
    float* a = W0 + idx[i] * 4;
    hn::StoreU(hn::Add(hn::LoadU(d4, a), hn::LoadU(d4, P + i * 4)), d4, a);
  }
}

float MaxOf(const float* HWY_RESTRICT x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto vm = hn::Set(d, -HUGE_VALF);
  int64_t i = 0;
  for (; i + N <= n; i += N) vm = hn::Max(vm, hn::LoadU(d, x + i));
  float m = hn::GetLane(hn::MaxOfLanes(d, vm));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

void DenseChunk(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch) {
  float* s = scratch;                // [nq, n]
  float* row = scratch + nq * n;     // [D]
  // Scores: tiles of 4 tokens x 4 queries keep 16 accumulators in registers.
  int64_t i0 = 0;
#if ANCHORKV_HW_F16
  if (D % static_cast<int64_t>(hn::Lanes(DF())) == 0) {
    const DF df;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
    const auto* k16 = reinterpret_cast<const hwy::float16_t*>(K16);
    for (; i0 + 4 <= n; i0 += 4) {
      for (int64_t g0 = 0; g0 < nq; g0 += 4) {
        const int64_t gn = nq - g0 < 4 ? nq - g0 : 4;
        hn::Vec<DF> acc[4][4];
        for (auto& r : acc)
          for (auto& a : r) a = hn::Zero(df);
        for (int64_t d = 0; d < D; d += NL) {
          const auto k0 = hn::PromoteTo(df, hn::LoadU(dh, k16 + (i0 + 0) * D + d));
          const auto k1 = hn::PromoteTo(df, hn::LoadU(dh, k16 + (i0 + 1) * D + d));
          const auto k2 = hn::PromoteTo(df, hn::LoadU(dh, k16 + (i0 + 2) * D + d));
          const auto k3 = hn::PromoteTo(df, hn::LoadU(dh, k16 + (i0 + 3) * D + d));
          for (int64_t g = 0; g < gn; ++g) {
            const auto qv = hn::LoadU(df, q + (g0 + g) * D + d);
            acc[g][0] = hn::MulAdd(qv, k0, acc[g][0]);
            acc[g][1] = hn::MulAdd(qv, k1, acc[g][1]);
            acc[g][2] = hn::MulAdd(qv, k2, acc[g][2]);
            acc[g][3] = hn::MulAdd(qv, k3, acc[g][3]);
          }
        }
        for (int64_t g = 0; g < gn; ++g)
          for (int64_t t = 0; t < 4; ++t)
            s[(g0 + g) * n + i0 + t] =
                pos0 + i0 + t <= qpos[g0 + g] ? hn::GetLane(hn::SumOfLanes(df, acc[g][t])) : -HUGE_VALF;
      }
    }
  }
#endif
  for (int64_t i = i0; i < n; ++i) {
    ToF32(K16 + i * D, row, D);
    for (int64_t g = 0; g < nq; ++g)
      s[g * n + i] = pos0 + i <= qpos[g] ? Dot(q + g * D, row, D) : -HUGE_VALF;
  }
  for (int64_t g = 0; g < nq; ++g) {
    const float m = MaxOf(s + g * n, n);
    out.m[g] = m;
    out.l[g] = m == -HUGE_VALF ? 0.0f : ExpShiftSum(s + g * n, n, m);
    std::fill_n(out.acc + g * D, D, 0.0f);
    if (m == -HUGE_VALF) std::fill_n(s + g * n, n, 0.0f);
  }
  // Values: for each block of N coordinates, the accumulators of up to four
  // queries stay in registers while the tokens stream by.
  int64_t d0 = 0;
#if ANCHORKV_HW_F16
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto* v16 = reinterpret_cast<const hwy::float16_t*>(V16);
  for (; d0 + N <= D; d0 += N) {
    for (int64_t g0 = 0; g0 < nq; g0 += 4) {
      const int64_t gn = nq - g0 < 4 ? nq - g0 : 4;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      const float* p0 = s + g0 * n;
      for (int64_t i = 0; i < n; ++i) {
        const auto v = hn::PromoteTo(df, hn::LoadU(dh, v16 + i * D + d0));
        a0 = hn::MulAdd(hn::Set(df, p0[i]), v, a0);
        if (gn > 1) a1 = hn::MulAdd(hn::Set(df, p0[n + i]), v, a1);
        if (gn > 2) a2 = hn::MulAdd(hn::Set(df, p0[2 * n + i]), v, a2);
        if (gn > 3) a3 = hn::MulAdd(hn::Set(df, p0[3 * n + i]), v, a3);
      }
      hn::StoreU(a0, df, out.acc + g0 * D + d0);
      if (gn > 1) hn::StoreU(a1, df, out.acc + (g0 + 1) * D + d0);
      if (gn > 2) hn::StoreU(a2, df, out.acc + (g0 + 2) * D + d0);
      if (gn > 3) hn::StoreU(a3, df, out.acc + (g0 + 3) * D + d0);
    }
  }
#endif
  if (d0 < D) {  // remaining coordinates (or every coordinate without hardware fp16)
    for (int64_t i = 0; i < n; ++i) {
      ToF32(V16 + i * D, row, D);
      for (int64_t g = 0; g < nq; ++g) {
        float* acc = out.acc + g * D;
        const float p = s[g * n + i];
        for (int64_t d = d0; d < D; ++d) acc[d] += p * row[d];
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::kernels {

HWY_EXPORT(DenseChunk);
HWY_EXPORT(ExpShiftSum);
HWY_EXPORT(MaxOf);
HWY_EXPORT(GatherScaled);
HWY_EXPORT(ScatterAdd4);

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The primitives a kernel is written in. FastOps are SIMD (Highway, dynamic
// dispatch); RefOps are plain scalar loops. A kernel written once over Ops
// gives the fast path and its scalar twin (tested against each other).
struct RefOps {
  static float dot(const float* x, const float* y, int64_t D) { return core::dot_ref(x, y, D); }
  static void dot_matrix(const float* X, int64_t n, const float* Y, int64_t k, int64_t D, float* out) {
    core::dot_matrix_ref(X, n, D, Y, k, D, D, out, k);
  }
  static void axpy(float a, const float* x, float* y, int64_t D) { core::axpy_ref(a, x, y, D); }
  static void accumulate_rows(const float* W, int64_t n, const float* Z, int64_t nq, int64_t D, float* out) {
    core::accumulate_rows_ref(W, n, Z, n, nq, D, out, D);
  }
  static float max_of(const float* x, int64_t n) {
    float m = kNegInf;
    for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }
  static float exp_shift_sum(float* x, int64_t n, float m) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - m);
      sum += x[i];
    }
    return sum;
  }
  // out[i] = scale[i] * table[idx[i]]
  static void gather_scaled(const float* table, const int32_t* idx, const float* scale, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = scale[i] * table[idx[i]];
  }
  static void value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n, int64_t k,
                            float* w, EntryScratch& sc);
};

struct FastOps {
  static float dot(const float* x, const float* y, int64_t D) { return core::dot(x, y, D); }
  static void dot_matrix(const float* X, int64_t n, const float* Y, int64_t k, int64_t D, float* out) {
    core::dot_matrix(X, n, D, Y, k, D, D, out, k);
  }
  static void axpy(float a, const float* x, float* y, int64_t D) { core::axpy(a, x, y, D); }
  static void accumulate_rows(const float* W, int64_t n, const float* Z, int64_t nq, int64_t D, float* out) {
    core::accumulate_rows(W, n, Z, n, nq, D, out, D);
  }
  static float max_of(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxOf)(x, n); }
  static float exp_shift_sum(float* x, int64_t n, float m) { return HWY_DYNAMIC_DISPATCH(ExpShiftSum)(x, n, m); }
  static void gather_scaled(const float* table, const int32_t* idx, const float* scale, int64_t n, float* out) {
    HWY_DYNAMIC_DISPATCH(GatherScaled)(table, idx, scale, n, out);
  }
  static void value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n, int64_t k,
                            float* w, EntryScratch& sc);
};

// Per query: m = max, x = exp(x - m), l = sum (fully masked rows: m = -inf, l = 0, x = 0).
template <class Ops>
void softmax_stats(float* s, int64_t nq, int64_t n, float* m_out, float* l_out) {
  for (int64_t g = 0; g < nq; ++g) {
    float* x = s + g * n;
    const float m = Ops::max_of(x, n);  // the max is exact either way
    m_out[g] = m;
    if (m == kNegInf) {
      l_out[g] = 0;
      std::fill_n(x, n, 0.0f);
    } else {
      l_out[g] = Ops::exp_shift_sum(x, n, m);
    }
  }
}

// w[g, j] = sum over entries i with av[i] == j of p[g, i] * gv[i]. Neighbouring
// tokens often share an anchor: four interleaved partial sums keep the
// scatter-adds from waiting on each other through memory.
void RefOps::value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n, int64_t k,
                           float* w, EntryScratch& sc) {
  sc.w4.assign(static_cast<size_t>(4 * k), 0.0f);
  float* w4 = sc.w4.data();
  for (int64_t g = 0; g < nq; ++g) {
    const float* pg = p + g * n;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      w4[av[i]] += pg[i] * gv[i];
      w4[k + av[i + 1]] += pg[i + 1] * gv[i + 1];
      w4[2 * k + av[i + 2]] += pg[i + 2] * gv[i + 2];
      w4[3 * k + av[i + 3]] += pg[i + 3] * gv[i + 3];
    }
    for (; i < n; ++i) w4[av[i]] += pg[i] * gv[i];
    for (int64_t j = 0; j < k; ++j) {
      w[g * k + j] = (w4[j] + w4[k + j]) + (w4[2 * k + j] + w4[3 * k + j]);
      w4[j] = w4[k + j] = w4[2 * k + j] = w4[3 * k + j] = 0.0f;
    }
  }
}

// Groups of 4 queries: token-major weights p_t * gamma_t scattered with one
// 4-lane add per token (ScatterAdd4), then back to query-major w.
void FastOps::value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n, int64_t k,
                            float* w, EntryScratch& sc) {
  if (nq % 4 != 0) return RefOps::value_weights(p, gv, av, nq, n, k, w, sc);
  sc.pt.resize(static_cast<size_t>(4 * n));
  sc.wa.resize(static_cast<size_t>(4 * k));
  sc.wb.resize(sc.wa.size());
  for (int64_t g0 = 0; g0 < nq; g0 += 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < 4; ++g) sc.pt[i * 4 + g] = p[(g0 + g) * n + i] * gv[i];
    std::fill(sc.wa.begin(), sc.wa.end(), 0.0f);
    std::fill(sc.wb.begin(), sc.wb.end(), 0.0f);
    HWY_DYNAMIC_DISPATCH(ScatterAdd4)(sc.pt.data(), av, n, sc.wa.data(), sc.wb.data());
    for (int64_t g = 0; g < 4; ++g)
      for (int64_t j = 0; j < k; ++j) w[(g0 + g) * k + j] = sc.wa[j * 4 + g] + sc.wb[j * 4 + g];
  }
}

template <class Ops>
void dense_chunk_rope_impl(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                           const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                           const RopeTable& table, PartialView out, float* scratch) {
  float* s = scratch;              // [nq, n]
  float* keys = scratch + nq * n;  // [n, D] keys rotated to their positions, then one value row
  for (int64_t i = 0; i < n; ++i) {
    float* row = keys + i * D;
    core::f16_to_f32_n(K16 + i * D, row, D);
    const int64_t p = pos0 + i + rope.position_offset;
    rope_rotate(row, D, rope.style, table.c(p), table.s(p));
  }
  Ops::dot_matrix(q, nq, keys, n, D, s);
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t i = 0; i < n; ++i)
      if (pos0 + i > qpos[g]) s[g * n + i] = kNegInf;
  softmax_stats<Ops>(s, nq, n, out.m, out.l);
  std::fill_n(out.acc, nq * D, 0.0f);
  float* row = keys;
  for (int64_t i = 0; i < n; ++i) {
    core::f16_to_f32_n(V16 + i * D, row, D);
    for (int64_t g = 0; g < nq; ++g) Ops::axpy(s[g * n + i], row, out.acc + g * D, D);
  }
}

// ---------------------------------------------------------------- entries

// Anchor ordinals, coefficients, residual flags and (when needed) positions
// of the range's entries. Exact in either path.
void decode_entries(const CompressedQueries& cq, const compress::CompressedRow& row, const EntryRange& r,
                    EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0;
  sc.ak.resize(static_cast<size_t>(n));
  sc.av.resize(static_cast<size_t>(n));
  sc.gk.resize(static_cast<size_t>(n));
  sc.gv.resize(static_cast<size_t>(n));
  sc.pos.resize(static_cast<size_t>(n));
  sc.res_k.clear();
  sc.res_v.clear();
  if (row.compact) {  // one SIMD conversion instead of one call per token
    core::f16_to_f32_n(&row.k.coef16[static_cast<size_t>(r.e0)], sc.gk.data(), n);
    core::f16_to_f32_n(&row.v.coef16[static_cast<size_t>(r.e0)], sc.gv.data(), n);
  } else {
    std::copy_n(&row.k.coef[static_cast<size_t>(r.e0)], n, sc.gk.data());
    std::copy_n(&row.v.coef[static_cast<size_t>(r.e0)], n, sc.gv.data());
  }
  compress::EntryMetaReader meta(row, r.e0, r.masked || cq.rope != nullptr);
  for (int64_t i = 0; i < n; ++i) {
    const compress::Meta m = meta.next();
    sc.ak[i] = m.anchor_k;
    sc.av[i] = m.anchor_v;
    if (m.res_k) sc.res_k.push_back(static_cast<int32_t>(i));
    if (m.res_v) sc.res_v.push_back(static_cast<int32_t>(i));
    sc.pos[i] = r.seg_pos0 + r.e0 + i + m.anchors_before;
  }
}

// Scores of the anchor approximation: gamma_t * (q . a_K(t)); with pre-RoPE
// keys q . RoPE_t(gamma a) = gamma * sum_i C_i cos(t theta_i) + S_i sin(t theta_i).
template <class Ops>
void score_anchor_approx(const CompressedQueries& cq, int64_t k, int64_t D, const EntryRange& r,
                         EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nq = cq.nq, half = D / 2;
  float* s = sc.s.data();
  if (cq.rope) {
    sc.cs_row.resize(static_cast<size_t>(D));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = sc.pos[i] + cq.rope->position_offset;
      std::copy_n(cq.table->c(p), half, sc.cs_row.data());
      std::copy_n(cq.table->s(p), half, sc.cs_row.data() + half);
      for (int64_t g = 0; g < nq; ++g) {
        const float* csg = cq.cs + (g * k + sc.ak[i]) * D;
        s[g * n + i] = (!r.masked || sc.pos[i] <= cq.qpos[g]) ? sc.gk[i] * Ops::dot(csg, sc.cs_row.data(), D)
                                                             : kNegInf;
      }
    }
    return;
  }
  for (int64_t g = 0; g < nq; ++g) Ops::gather_scaled(cq.anchor_dot + g * k, sc.ak.data(), sc.gk.data(), n, s + g * n);
  if (r.masked)
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t i = 0; i < n; ++i)
        if (sc.pos[i] > cq.qpos[g]) s[g * n + i] = kNegInf;
}

// Key residuals add (R q) . (scale * level[code]): every residual of the
// chunk decoded, then one dot_matrix against the rotated queries. Pre-RoPE:
// each residual key is rotated back and to its position once, and shared by
// every query of the group.
template <class Ops>
void add_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                       const compress::ResidualCodec& codec, const EntryRange& r, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nq = cq.nq, D = codec.dim(), cb = codec.code_bytes();
  const int64_t nr = static_cast<int64_t>(sc.res_k.size());
  if (nr == 0) return;
  float* s = sc.s.data();
  sc.codes.resize(static_cast<size_t>(D));
  if (cq.rope) {
    sc.z.resize(static_cast<size_t>(D));
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t i = sc.res_k[j], slot = r.slot_k0 + j;
      const float scale = core::half_to_float(row.k.scales[slot]);
      codec.decode_levels(&row.k.codes[static_cast<size_t>(slot * cb)], sc.z.data(), sc.codes.data());
      codec.rotation().inverse(sc.z.data(), sc.z.data());
      const int64_t p = sc.pos[i] + cq.rope->position_offset;
      rope_rotate(sc.z.data(), D, cq.rope->style, cq.table->c(p), cq.table->s(p));
      for (int64_t g = 0; g < nq; ++g)
        if (s[g * n + i] != kNegInf) s[g * n + i] += scale * Ops::dot(cq.q + g * D, sc.z.data(), D);
    }
    return;
  }
  sc.z.resize(static_cast<size_t>(nr * D));
  sc.zscale.resize(static_cast<size_t>(nr));
  sc.zdot.resize(static_cast<size_t>(nq * nr));
  for (int64_t j = 0; j < nr; ++j) {
    const int64_t slot = r.slot_k0 + j;
    codec.decode_levels(&row.k.codes[static_cast<size_t>(slot * cb)], &sc.z[j * D], sc.codes.data());
    sc.zscale[j] = core::half_to_float(row.k.scales[slot]);
  }
  Ops::dot_matrix(cq.rq, nq, sc.z.data(), nr, D, sc.zdot.data());
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t g = 0; g < nq; ++g)
      if (s[g * n + sc.res_k[j]] != kNegInf) s[g * n + sc.res_k[j]] += sc.zscale[j] * sc.zdot[g * nr + j];
}

// Value residuals: rot[g] += sum_j p[g, i_j] * scale_j * level[codes_j], all rows at once.
template <class Ops>
void add_value_residuals(const compress::CompressedRow& row, const compress::ResidualCodec& codec,
                         const EntryRange& r, int64_t nq, PartialView out, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, D = codec.dim(), cb = codec.code_bytes();
  const int64_t nr = static_cast<int64_t>(sc.res_v.size());
  if (nr == 0) return;
  sc.codes.resize(static_cast<size_t>(D));
  sc.z.resize(static_cast<size_t>(nr * D));
  sc.zdot.resize(static_cast<size_t>(nq * nr));
  for (int64_t j = 0; j < nr; ++j) {
    const int64_t slot = r.slot_v0 + j;
    codec.decode_levels(&row.v.codes[static_cast<size_t>(slot * cb)], &sc.z[j * D], sc.codes.data());
    const float scale = core::half_to_float(row.v.scales[slot]);
    for (int64_t g = 0; g < nq; ++g) sc.zdot[g * nr + j] = sc.s[g * n + sc.res_v[j]] * scale;
  }
  Ops::accumulate_rows(sc.zdot.data(), nr, sc.z.data(), nq, D, out.rot);
}

template <class Ops>
void entries_chunk_impl(const CompressedQueries& cq, const compress::CompressedRow& row,
                        const compress::ResidualCodec& codec, const EntryRange& r, PartialView out,
                        EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nq = cq.nq, D = codec.dim(), k = row.n_anchor;
  sc.s.resize(static_cast<size_t>(nq * n));
  decode_entries(cq, row, r, sc);
  score_anchor_approx<Ops>(cq, k, D, r, sc);
  add_key_residuals<Ops>(cq, row, codec, r, sc);
  softmax_stats<Ops>(sc.s.data(), nq, n, out.m, out.l);
  // Values: per-anchor weights sum_t p_t gamma_t, residuals in the rotated domain.
  std::fill_n(out.acc, nq * D, 0.0f);
  std::fill_n(out.rot, nq * D, 0.0f);
  Ops::value_weights(sc.s.data(), sc.gv.data(), sc.av.data(), nq, n, k, out.w, sc);
  add_value_residuals<Ops>(row, codec, r, nq, out, sc);
}

}  // namespace

void dense_chunk(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                 int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch) {
  HWY_DYNAMIC_DISPATCH(DenseChunk)(q, qpos, nq, K16, V16, n, pos0, D, out, scratch);
}

void dense_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                     int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch) {
  float* s = scratch;             // [nq, n]
  float* row = scratch + nq * n;  // [D]
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < D; ++d) row[d] = core::half_to_float(K16[i * D + d]);
    for (int64_t g = 0; g < nq; ++g) {
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[g * D + d] * row[d];
      s[g * n + i] = pos0 + i <= qpos[g] ? dot : kNegInf;
    }
  }
  softmax_stats<RefOps>(s, nq, n, out.m, out.l);
  std::fill_n(out.acc, nq * D, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < D; ++d) row[d] = core::half_to_float(V16[i * D + d]);
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t d = 0; d < D; ++d) out.acc[g * D + d] += s[g * n + i] * row[d];
  }
}

void dense_chunk_rope(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                      int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope, const RopeTable& table,
                      PartialView out, float* scratch) {
  dense_chunk_rope_impl<FastOps>(q, qpos, nq, K16, V16, n, pos0, D, rope, table, out, scratch);
}

void dense_chunk_rope_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                          const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                          const RopeTable& table, PartialView out, float* scratch) {
  dense_chunk_rope_impl<RefOps>(q, qpos, nq, K16, V16, n, pos0, D, rope, table, out, scratch);
}

void anchors_chunk(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                   PartialView out) {
  // Scores are the exact q . a_j; each anchor's value is its own (gamma = 1).
  for (int64_t g = 0; g < cq.nq; ++g) {
    float* w = out.w + g * k;
    for (int64_t j = 0; j < k; ++j)
      w[j] = (!masked || anchor_pos[j] <= cq.qpos[g]) ? cq.anchor_dot[g * k + j] : kNegInf;
  }
  softmax_stats<RefOps>(out.w, cq.nq, k, out.m, out.l);
  // Anchors contribute through w only; acc and rot stay as the caller zeroed them.
}

void entries_chunk(const CompressedQueries& cq, const compress::CompressedRow& row,
                   const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                   EntryScratch& scratch) {
  entries_chunk_impl<FastOps>(cq, row, codec, range, out, scratch);
}

void entries_chunk_ref(const CompressedQueries& cq, const compress::CompressedRow& row,
                       const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                       EntryScratch& scratch) {
  entries_chunk_impl<RefOps>(cq, row, codec, range, out, scratch);
}

void merge_partial(float& m_a, float& l_a, float* acc_a, float* w_a, float* rot_a, float m_b, float l_b,
                   const float* acc_b, const float* w_b, const float* rot_b, int64_t D, int64_t k) {
  if (m_b == kNegInf) return;  // b saw no token
  if (m_a == kNegInf) {        // a saw none: take b
    m_a = m_b;
    l_a = l_b;
    std::copy_n(acc_b, D, acc_a);
    if (w_a && w_b) std::copy_n(w_b, k, w_a);
    if (rot_a && rot_b) std::copy_n(rot_b, D, rot_a);
    return;
  }
  const float m = std::max(m_a, m_b);
  const float fa = std::exp(m_a - m), fb = std::exp(m_b - m);
  m_a = m;
  l_a = l_a * fa + l_b * fb;
  for (int64_t d = 0; d < D; ++d) acc_a[d] = acc_a[d] * fa + acc_b[d] * fb;
  if (w_a) {
    for (int64_t j = 0; j < k; ++j) w_a[j] = w_a[j] * fa + (w_b ? w_b[j] * fb : 0.0f);
  }
  if (rot_a) {
    for (int64_t d = 0; d < D; ++d) rot_a[d] = rot_a[d] * fa + (rot_b ? rot_b[d] * fb : 0.0f);
  }
}

}  // namespace anchorkv::kernels
#endif  // HWY_ONCE
