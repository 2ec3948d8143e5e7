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

float exp_shift_sum_ref(float* x, int64_t n, float m) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

float max_of(const float* x, int64_t n) {
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Per query: m = max, x = exp(x - m), l = sum (fully masked rows: m = -inf, l = 0, x = 0).
void softmax_stats(float* s, int64_t nq, int64_t n, float* m_out, float* l_out, bool reference) {
  for (int64_t g = 0; g < nq; ++g) {
    float* x = s + g * n;
    const float m = reference ? max_of(x, n) : HWY_DYNAMIC_DISPATCH(MaxOf)(x, n);  // max is exact either way
    m_out[g] = m;
    if (m == kNegInf) {
      l_out[g] = 0;
      std::fill_n(x, n, 0.0f);
    } else {
      l_out[g] = reference ? exp_shift_sum_ref(x, n, m) : HWY_DYNAMIC_DISPATCH(ExpShiftSum)(x, n, m);
    }
  }
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
  softmax_stats(s, nq, n, out.m, out.l, true);
  std::fill_n(out.acc, nq * D, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < D; ++d) row[d] = core::half_to_float(V16[i * D + d]);
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t d = 0; d < D; ++d) out.acc[g * D + d] += s[g * n + i] * row[d];
  }
}

void dense_chunk_rope(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                      int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope, const RopeTable& table,
                      PartialView out, float* scratch, bool reference) {
  float* s = scratch;              // [nq, n]
  float* keys = scratch + nq * n;  // [n, D] keys rotated to their positions, then one value row
  for (int64_t i = 0; i < n; ++i) {
    float* row = keys + i * D;
    core::f16_to_f32_n(K16 + i * D, row, D);
    const int64_t p = pos0 + i + rope.position_offset;
    rope_rotate(row, D, rope.style, table.c(p), table.s(p));
  }
  if (reference)
    core::dot_matrix_ref(q, nq, D, keys, n, D, D, s, n);
  else
    core::dot_matrix(q, nq, D, keys, n, D, D, s, n);
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t i = 0; i < n; ++i)
      if (pos0 + i > qpos[g]) s[g * n + i] = kNegInf;
  softmax_stats(s, nq, n, out.m, out.l, reference);
  std::fill_n(out.acc, nq * D, 0.0f);
  float* row = keys;
  for (int64_t i = 0; i < n; ++i) {
    core::f16_to_f32_n(V16 + i * D, row, D);
    for (int64_t g = 0; g < nq; ++g) {
      if (reference)
        core::axpy_ref(s[g * n + i], row, out.acc + g * D, D);
      else
        core::axpy(s[g * n + i], row, out.acc + g * D, D);
    }
  }
}

void anchors_chunk(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                   PartialView out) {
  // Scores are the exact q . a_j; each anchor's value is its own (gamma = 1).
  for (int64_t g = 0; g < cq.nq; ++g) {
    float* w = out.w + g * k;
    for (int64_t j = 0; j < k; ++j)
      w[j] = (!masked || anchor_pos[j] <= cq.qpos[g]) ? cq.anchor_dot[g * k + j] : kNegInf;
  }
  softmax_stats(out.w, cq.nq, k, out.m, out.l, true);
  // Anchors contribute through w only; acc and rot stay as the caller zeroed them.
}

void entries_chunk(const CompressedQueries& cq, const compress::CompressedRow& row,
                   const compress::ResidualCodec& codec, int64_t e0, int64_t e1, int64_t slot_k0,
                   int64_t slot_v0, int64_t seg_pos0, bool masked, PartialView out, float* scratch, bool reference) {
  const int64_t n = e1 - e0, nq = cq.nq, D = codec.dim(), k = row.n_anchor;
  const int64_t cb = codec.code_bytes();
  float* s = scratch;                     // [nq, n]
  float* coef_v = scratch + nq * n;       // [n]
  auto* ak = reinterpret_cast<int32_t*>(coef_v + n);  // [n]
  auto* av = ak + n;                      // [n]
  float* z = reinterpret_cast<float*>(av + n);  // [D] decoded rotated residual
  auto* codes = reinterpret_cast<uint8_t*>(z + D);  // [D]
  thread_local std::vector<int32_t> res_k, res_v;  // chunk-local indices of residual entries
  res_k.clear();
  res_v.clear();

  // Scores of the anchor approximation: gamma_t * (q . a_K(t)).
  thread_local std::vector<int64_t> tpos;  // token positions (RoPE only)
  if (cq.rope) tpos.resize(static_cast<size_t>(n));
  // Coefficients of the chunk as floats (compact rows store fp16: one SIMD
  // conversion here instead of one call per token).
  thread_local std::vector<float> gk_buf;
  const float* gk;
  if (row.compact) {
    gk_buf.resize(static_cast<size_t>(n));
    core::f16_to_f32_n(&row.k.coef16[static_cast<size_t>(e0)], gk_buf.data(), n);
    core::f16_to_f32_n(&row.v.coef16[static_cast<size_t>(e0)], coef_v, n);
    gk = gk_buf.data();
  } else {
    gk = &row.k.coef[static_cast<size_t>(e0)];
    std::copy_n(&row.v.coef[static_cast<size_t>(e0)], n, coef_v);
  }
  // Token positions are needed for causal masking and RoPE only. Compact rows
  // derive anchors_before by binary search once, then step it.
  const bool need_pos = masked || cq.rope != nullptr;
  int64_t before = row.compact && need_pos ? row.meta_at(e0).anchors_before : 0;
  for (int64_t i = 0; i < n; ++i) {
    compress::Meta m;
    if (row.compact) {
      const uint32_t w = row.meta32[e0 + i];
      m.anchor_k = static_cast<int32_t>(w & 0x7FFF);
      m.res_k = (w >> 15) & 1;
      m.anchor_v = static_cast<int32_t>((w >> 16) & 0x7FFF);
      m.res_v = (w >> 31) & 1;
      if (need_pos) {
        while (before < row.n_anchor && row.anchor_pos[before] - before <= e0 + i) ++before;
        m.anchors_before = static_cast<int32_t>(before);
      }
    } else {
      m = compress::unpack_meta(row.meta[e0 + i]);
    }
    ak[i] = m.anchor_k;
    av[i] = m.anchor_v;
    if (m.res_k) res_k.push_back(static_cast<int32_t>(i));
    if (m.res_v) res_v.push_back(static_cast<int32_t>(i));
    const int64_t pos = seg_pos0 + e0 + i + m.anchors_before;
    if (cq.rope) {
      tpos[i] = pos;
      continue;
    }
    if (masked)
      for (int64_t g = 0; g < nq; ++g)
        s[g * n + i] = pos <= cq.qpos[g] ? gk[i] * cq.anchor_dot[g * k + ak[i]] : kNegInf;
  }
  // Unmasked scores gamma_t * (q . a_K(t)) for the whole chunk, one gather pass per query.
  if (!masked && !cq.rope)
    for (int64_t g = 0; g < nq; ++g) {
      if (reference) {
        for (int64_t i = 0; i < n; ++i) s[g * n + i] = gk[i] * cq.anchor_dot[g * k + ak[i]];
      } else {
        HWY_DYNAMIC_DISPATCH(GatherScaled)(cq.anchor_dot + g * k, ak, gk, n, s + g * n);
      }
    }
  // Pre-RoPE keys: q . RoPE_t(gamma a) = gamma * sum_i C_i cos(t theta_i) + S_i sin(t theta_i).
  const int64_t half = D / 2;
  if (cq.rope) {
    thread_local std::vector<float> cs_row;
    cs_row.resize(static_cast<size_t>(D));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = tpos[i] + cq.rope->position_offset;
      std::copy_n(cq.table->c(p), half, cs_row.data());
      std::copy_n(cq.table->s(p), half, cs_row.data() + half);
      for (int64_t g = 0; g < nq; ++g) {
        const float* csg = cq.cs + (g * k + ak[i]) * D;
        s[g * n + i] = (!masked || tpos[i] <= cq.qpos[g])
                           ? gk[i] * (reference ? core::dot_ref(csg, cs_row.data(), D) : core::dot(csg, cs_row.data(), D))
                           : kNegInf;
      }
    }
  }
  // Key residuals add (R q) . (scale * level[code]).
  thread_local std::vector<float> zk, zscale, zdot;
  if (!cq.rope) {
    zk.resize(res_k.size() * static_cast<size_t>(D));
    zscale.resize(res_k.size());
  }
  for (size_t r = 0; r < res_k.size(); ++r) {
    const int64_t i = res_k[r], slot = slot_k0 + static_cast<int64_t>(r);
    // (R q) . (scale * level[c]) = scale * ((R q) . level[c])
    const float sc = core::half_to_float(row.k.scales[slot]);
    if (!cq.rope) {  // batched below: one dot_matrix for every residual of the chunk
      codec.decode_levels(&row.k.codes[static_cast<size_t>(slot * cb)], &zk[r * D], codes);
      zscale[r] = sc;
      continue;
    }
    codec.decode_levels(&row.k.codes[static_cast<size_t>(slot * cb)], z, codes);
    {
      // q . RoPE_t(R^T z): the residual key is rotated back and to its position
      // once, and shared by every query of the group (one transform per token,
      // not one per token and query).
      codec.rotation().inverse(z, z);
      const int64_t p = tpos[i] + cq.rope->position_offset;
      rope_rotate(z, D, cq.rope->style, cq.table->c(p), cq.table->s(p));
      for (int64_t g = 0; g < nq; ++g) {
        if (s[g * n + i] == kNegInf) continue;
        const float* qg = cq.q + g * D;
        s[g * n + i] += sc * (reference ? core::dot_ref(qg, z, D) : core::dot(qg, z, D));
      }
    }
  }
  if (!cq.rope && !res_k.empty()) {
    const int64_t nr = static_cast<int64_t>(res_k.size());
    zdot.resize(static_cast<size_t>(nq * nr));
    if (reference) {
      for (int64_t g = 0; g < nq; ++g)
        for (int64_t r = 0; r < nr; ++r) zdot[g * nr + r] = core::dot_ref(cq.rq + g * D, &zk[r * D], D);
    } else {
      core::dot_matrix(cq.rq, nq, D, zk.data(), nr, D, D, zdot.data(), nr);
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t i = res_k[r];
      for (int64_t g = 0; g < nq; ++g)
        if (s[g * n + i] != kNegInf) s[g * n + i] += zscale[r] * zdot[g * nr + r];
    }
  }
  softmax_stats(s, nq, n, out.m, out.l, reference);
  // Values: per-anchor weights sum_t p_t gamma_t, residuals in the rotated domain.
  std::fill_n(out.acc, nq * D, 0.0f);
  std::fill_n(out.w, nq * k, 0.0f);
  std::fill_n(out.rot, nq * D, 0.0f);
  if (!reference && nq % 4 == 0) {
    // Token-major weights p_t * gamma_t of each group of 4 queries, scattered with
    // one 4-lane add per token (ScatterAdd4), then back to query-major w.
    thread_local std::vector<float> pt, wa, wb;
    pt.resize(static_cast<size_t>(4 * n));
    wa.resize(static_cast<size_t>(4 * k));
    wb.resize(wa.size());
    for (int64_t g0 = 0; g0 < nq; g0 += 4) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t g = 0; g < 4; ++g) pt[i * 4 + g] = s[(g0 + g) * n + i] * coef_v[i];
      std::fill(wa.begin(), wa.end(), 0.0f);
      std::fill(wb.begin(), wb.end(), 0.0f);
      HWY_DYNAMIC_DISPATCH(ScatterAdd4)(pt.data(), av, n, wa.data(), wb.data());
      for (int64_t g = 0; g < 4; ++g)
        for (int64_t j = 0; j < k; ++j) out.w[(g0 + g) * k + j] = wa[j * 4 + g] + wb[j * 4 + g];
    }
  } else {
    // Neighbouring tokens often share an anchor: four interleaved partial sums
    // keep the scatter-adds from waiting on each other through memory.
    thread_local std::vector<float> w4;
    w4.assign(static_cast<size_t>(4 * k), 0.0f);
    for (int64_t g = 0; g < nq; ++g) {
      float* w = out.w + g * k;
      const float* p = s + g * n;
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        w4[av[i]] += p[i] * coef_v[i];
        w4[k + av[i + 1]] += p[i + 1] * coef_v[i + 1];
        w4[2 * k + av[i + 2]] += p[i + 2] * coef_v[i + 2];
        w4[3 * k + av[i + 3]] += p[i + 3] * coef_v[i + 3];
      }
      for (; i < n; ++i) w4[av[i]] += p[i] * coef_v[i];
      for (int64_t j = 0; j < k; ++j) {
        w[j] = (w4[j] + w4[k + j]) + (w4[2 * k + j] + w4[3 * k + j]);
        w4[j] = w4[k + j] = w4[2 * k + j] = w4[3 * k + j] = 0.0f;
      }
    }
  }
  // Value residuals: rot[g] += sum_r p[g, i_r] * scale_r * level[codes_r], all rows at once.
  if (!res_v.empty()) {
    const int64_t nr = static_cast<int64_t>(res_v.size());
    zk.resize(static_cast<size_t>(nr * D));
    zdot.resize(static_cast<size_t>(nq * nr));
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t slot = slot_v0 + r;
      codec.decode_levels(&row.v.codes[static_cast<size_t>(slot * cb)], &zk[r * D], codes);
      const float sc = core::half_to_float(row.v.scales[slot]);
      for (int64_t g = 0; g < nq; ++g) zdot[g * nr + r] = s[g * n + res_v[r]] * sc;
    }
    (reference ? core::accumulate_rows_ref : core::accumulate_rows)(zdot.data(), nr, zk.data(), nr, nq, D, out.rot, D);
  }
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
