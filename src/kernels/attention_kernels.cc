// Attention kernels: scalar references and SIMD versions (Highway, dynamic
// dispatch) side by side. The compressed-row kernels are mostly gathers and
// scatters over per-token metadata; their exp runs through the same SIMD/scalar
// switch as the dense kernel.
#include "kernels/attention_kernels.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/bitpack.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/half.h"
#include "core/linalg.h"
#include "core/rope.h"
#include "kernels/entries.h"
#include "kernels/kernel_types.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_kernels.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "core/simd-inl.h"
// clang-format on

// The ops, compiled once per target with this file (kernels/ops_*-inl.h).
#include "kernels/ops_reduce-inl.h"
#include "kernels/ops_meta-inl.h"
#include "kernels/ops_f16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// acc[g, :] = sum_i s[g, i] * V[i, :] over fp16 rows; false when this target
// has no fast form for D (the caller then accumulates row by row).
bool DenseValues(const float* HWY_RESTRICT s, int64_t nq, int64_t n, const uint16_t* V16, int64_t D,
                 float* HWY_RESTRICT acc) {
#if ANCHORKV_HW_F16
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  if (D == 8 * N) return ValuesTwoQueries<8>(s, nq, n, V16, acc), true;
  if (D == 4 * N) return ValuesTwoQueries<4>(s, nq, n, V16, acc), true;
#endif
  (void)s, (void)nq, (void)n, (void)V16, (void)D, (void)acc;
  return false;
}

void DenseChunk(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch) {
  float* s = scratch;             // [nq, n]
  float* row = scratch + nq * n;  // [D]
  // Scores: tiles of 4 tokens x 4 queries keep 16 accumulators in registers.
  int64_t i0 = 0;
#if ANCHORKV_HW_F16
  if (D % static_cast<int64_t>(hn::Lanes(DF())) == 0) {
    const DF df;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
    const auto* k16 = reinterpret_cast<const hwy::float16_t*>(K16);
    for (; i0 + 4 <= n; i0 += 4) {
      // The next rows' lines are requested while these are scored.
      for (int64_t b = 0; b < 4 * D; b += 32) hwy::Prefetch(k16 + (i0 + 8) * D + b);
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
    for (int64_t g = 0; g < nq; ++g) s[g * n + i] = pos0 + i <= qpos[g] ? Dot(q + g * D, row, D) : -HUGE_VALF;
  }
  for (int64_t g = 0; g < nq; ++g) {
    const float m = MaxOf(s + g * n, n);
    out.m[g] = m;
    out.l[g] = m == -HUGE_VALF ? 0.0f : ExpShiftSum(s + g * n, n, m);
    std::fill_n(out.acc + g * D, D, 0.0f);
    if (m == -HUGE_VALF) std::fill_n(s + g * n, n, 0.0f);
  }
  // Values: rows stream by in order (whole 2*D-byte rows, so the hardware
  // prefetcher sees one sequential stream) while the D-wide accumulators of
  // up to two queries stay in registers; further query pairs re-read the
  // tile from cache.
  int64_t d0 = 0;
#if ANCHORKV_HW_F16
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  if (D == 8 * N) {
    ValuesTwoQueries<8>(s, nq, n, V16, out.acc);
    d0 = D;
  } else if (D == 4 * N) {
    ValuesTwoQueries<4>(s, nq, n, V16, out.acc);
    d0 = D;
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
HWY_EXPORT(DenseValues);
HWY_EXPORT(ExpShiftSum);
HWY_EXPORT(MaxOf);
HWY_EXPORT(GatherScaled);
HWY_EXPORT(ScatterAdd4);
HWY_EXPORT(SupportsF16Rows);
HWY_EXPORT(DotRowsF16);
HWY_EXPORT(AccumulateRowsF16Queries);
HWY_EXPORT(DecodeMetaSeed);
HWY_EXPORT(DecodeMetaCompact);
HWY_EXPORT(DecodeMetaTight);

const ResidualArithmetic& arithmetic_of(const CompressedQueries& cq) {
  static const ResidualArithmetic fp32;
  return cq.arith ? *cq.arith : fp32;
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Residual rows decoded to the levels of `a` (bf16: times lambda) or, in
// fp32, the codec's: z [nr, D] for slots [slot0, slot0 + nr).
void decode_levels_as(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                      const ResidualArithmetic& a, int64_t slot0, int64_t nr, float* z, EntryScratch& sc) {
  const int64_t D = codec.dim(), cb = codec.code_bytes();
  sc.codes.resize(static_cast<size_t>(D));
  for (int64_t j = 0; j < nr; ++j) {
    const uint8_t* codes = &side.codes[static_cast<size_t>((slot0 + j) * cb)];
    if (a.bf16)
      core::decode_codes_2bit(codes, a.levels, D, z + j * D);
    else
      codec.decode_levels(codes, z + j * D, sc.codes.data());
  }
}

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
  static void gather_scaled(const float* table, const int32_t* idx, const float* scale, int64_t n,
                            float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = scale[i] * table[idx[i]];
  }
  static void value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n,
                            int64_t k, float* w, EntryScratch& sc);
  static bool dense_values(const float*, int64_t, int64_t, const uint16_t*, int64_t, float*) { return false; }
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
  static float exp_shift_sum(float* x, int64_t n, float m) {
    return HWY_DYNAMIC_DISPATCH(ExpShiftSum)(x, n, m);
  }
  static void gather_scaled(const float* table, const int32_t* idx, const float* scale, int64_t n,
                            float* out) {
    HWY_DYNAMIC_DISPATCH(GatherScaled)(table, idx, scale, n, out);
  }
  static void value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n,
                            int64_t k, float* w, EntryScratch& sc);
  // acc = P V over fp16 rows in one pass (false: no fast form for D here).
  static bool dense_values(const float* p, int64_t nq, int64_t n, const uint16_t* V16, int64_t D,
                           float* acc) {
    return HWY_DYNAMIC_DISPATCH(DenseValues)(p, nq, n, V16, D, acc);
  }
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
void RefOps::value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n,
                           int64_t k, float* w, EntryScratch& sc) {
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
void FastOps::value_weights(const float* p, const float* gv, const int32_t* av, int64_t nq, int64_t n,
                            int64_t k, float* w, EntryScratch& sc) {
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
  float* s = scratch;        // [nq, n]
  float* keys = s + nq * n;  // [n, D] keys rotated by their offset in a kRopeStep-block, then one value row
  float* qb = keys + n * D;  // [nq, D] the queries rotated back to the block's start
  float* sb = qb + nq * D;   // [nq, kRopeStep] the block's scores
  const int64_t half = D / 2;
  // q . RoPE_{p0 + j}(k) = RoPE_{-p0}(q) . RoPE_j(k): the keys read only the
  // near rows (cache-resident), the queries one step row per block.
  for (int64_t i0 = 0, nb = 0; i0 < n; i0 += nb) {
    const int64_t p0 = pos0 + i0 + rope.position_offset, b = p0 / kRopeStep, j0 = p0 % kRopeStep;
    nb = std::min(n - i0, kRopeStep - j0);
    std::copy_n(q, nq * D, qb);
    for (int64_t g = 0; g < nq; ++g)
      core::rope_rotate(qb + g * D, D, rope.style, &table.step_cos[static_cast<size_t>(b * half)],
                        &table.step_sin[static_cast<size_t>(b * half)], /*inverse=*/true);
    for (int64_t i = 0; i < nb; ++i) {
      float* row = keys + (i0 + i) * D;
      core::f16_to_f32_n(K16 + (i0 + i) * D, row, D);
      const size_t j = static_cast<size_t>((j0 + i) * half);
      core::rope_rotate(row, D, rope.style, &table.near_cos[j], &table.near_sin[j]);
    }
    Ops::dot_matrix(qb, nq, keys + i0 * D, nb, D, sb);
    for (int64_t g = 0; g < nq; ++g) std::copy_n(sb + g * nb, nb, s + g * n + i0);
  }
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t i = 0; i < n; ++i)
      if (pos0 + i > qpos[g]) s[g * n + i] = kNegInf;
  softmax_stats<Ops>(s, nq, n, out.m, out.l);
  if (Ops::dense_values(s, nq, n, V16, D, out.acc)) return;
  std::fill_n(out.acc, nq * D, 0.0f);
  float* row = keys;
  for (int64_t i = 0; i < n; ++i) {
    core::f16_to_f32_n(V16 + i * D, row, D);
    for (int64_t g = 0; g < nq; ++g) Ops::axpy(s[g * n + i], row, out.acc + g * D, D);
  }
}

}  // namespace

// ---------------------------------------------------------------- entries

namespace {

// Each layout's coefficients of entries [e0, e0 + n): the seed layout's fp32
// read in place, the others decoded into the scratch.
void decode_coefs(compress::SeedLayout, const compress::CompressedRow& row, int64_t e0, int64_t,
                  EntryScratch& sc) {
  sc.gk_at = row.k.coef.data() + e0;
  sc.gv_at = row.v.coef.data() + e0;
}
void decode_coefs(compress::CompactLayout, const compress::CompressedRow& row, int64_t e0, int64_t n,
                  EntryScratch& sc) {  // one SIMD conversion instead of one call per token
  sc.gk.resize(static_cast<size_t>(n));
  sc.gv.resize(static_cast<size_t>(n));
  core::f16_to_f32_n(&row.k.coef16[static_cast<size_t>(e0)], sc.gk.data(), n);
  core::f16_to_f32_n(&row.v.coef16[static_cast<size_t>(e0)], sc.gv.data(), n);
  sc.gk_at = sc.gk.data();
  sc.gv_at = sc.gv.data();
}
void decode_coefs(compress::TightLayout, const compress::CompressedRow& row, int64_t e0, int64_t n,
                  EntryScratch& sc) {  // 256-entry tables per side: a code indexes its gamma
  if (sc.tight_k_exp != row.k.coef_exp) compress::tight_coef_table(sc.tight_k_exp = row.k.coef_exp, sc.tight_k);
  if (sc.tight_v_exp != row.v.coef_exp) compress::tight_coef_table(sc.tight_v_exp = row.v.coef_exp, sc.tight_v);
  sc.gk.resize(static_cast<size_t>(n));
  sc.gv.resize(static_cast<size_t>(n));
  const float *tk = sc.tight_k, *tv = sc.tight_v;
  const uint8_t* ck = &row.k.coef8[static_cast<size_t>(e0)];
  const uint8_t* cv = &row.v.coef8[static_cast<size_t>(e0)];
  for (int64_t i = 0; i < n; ++i) sc.gk[i] = tk[ck[i]], sc.gv[i] = tv[cv[i]];
  sc.gk_at = sc.gk.data();
  sc.gv_at = sc.gv.data();
}

// Each layout's bit fields of entries [e0, e0 + n), decoded in SIMD.
void decode_fields(compress::SeedLayout, const compress::CompressedRow& row, int64_t e0, int64_t n, MetaOut* mo) {
  HWY_DYNAMIC_DISPATCH(DecodeMetaSeed)(&row.meta[static_cast<size_t>(e0)], n, mo);
}
void decode_fields(compress::CompactLayout, const compress::CompressedRow& row, int64_t e0, int64_t n,
                   MetaOut* mo) {
  HWY_DYNAMIC_DISPATCH(DecodeMetaCompact)(&row.meta32[static_cast<size_t>(e0)], n, mo);
}
void decode_fields(compress::TightLayout, const compress::CompressedRow& row, int64_t e0, int64_t n, MetaOut* mo) {
  const auto e = static_cast<size_t>(e0);
  HWY_DYNAMIC_DISPATCH(DecodeMetaTight)(&row.meta16[e], &row.k.coef8[e], &row.v.coef8[e], n, mo);
}

// Positions of entries [e0, e0 + n) of a segment starting at p0: from the
// seed layout's anchors_before field, or (layouts that list the anchors'
// positions) one walk over the list, anchor j having anchor_pos[j] - j
// entries before it (per entry through EntryMetaReader it was ~6% of a
// pre-RoPE decode).
template <class L>
void entry_positions(L, const compress::CompressedRow& row, int64_t e0, int64_t n, int64_t p0, int64_t* pos) {
  if constexpr (!L::kListsPositions) {
    const uint64_t* w = &row.meta[static_cast<size_t>(e0)];
    for (int64_t i = 0; i < n; ++i) pos[i] = p0 + i + compress::unpack_meta(w[i]).anchors_before;
  } else if (n > 0) {
    const int32_t* ap = row.anchor_pos.data();
    int64_t j = row.meta_at(e0).anchors_before;
    for (int64_t i = 0; i < n; ++i) {
      while (j < row.n_anchor && ap[j] - j <= e0 + i) ++j;
      pos[i] = p0 + i + j;
    }
  }
}

}  // namespace

void decode_entries(const CompressedQueries& cq, const compress::CompressedRow& row, const EntryRange& r,
                    EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0;
  sc.ak.resize(static_cast<size_t>(n));
  sc.av.resize(static_cast<size_t>(n));
  sc.pos.resize(static_cast<size_t>(n));
  compress::with_layout(row.layout, [&](auto L) { decode_coefs(L, row, r.e0, n, sc); });
  sc.res_k.resize(static_cast<size_t>(n + kListSlack));
  sc.res_v.resize(static_cast<size_t>(n + kListSlack));
  int64_t nk = 0, nv = 0;
  // Unmasked: the bit fields decoded in SIMD, then (RoPE) the positions.
  if (!r.masked) {
    MetaOut mo{sc.ak.data(), sc.av.data(), sc.res_k.data(), sc.res_v.data()};
    compress::with_layout(row.layout, [&](auto L) {
      decode_fields(L, row, r.e0, n, &mo);
      if (cq.rope) entry_positions(L, row, r.e0, n, r.seg_pos0 + r.e0, sc.pos.data());
    });
    nk = mo.nk, nv = mo.nv;
  } else {
    compress::EntryMetaReader meta(row, r.e0, true);
    for (int64_t i = 0; i < n; ++i) {
      const compress::Meta m = meta.next();
      sc.ak[i] = m.anchor_k;
      sc.av[i] = m.anchor_v;
      sc.res_k[nk] = static_cast<int32_t>(i), nk += m.res_k;
      sc.res_v[nv] = static_cast<int32_t>(i), nv += m.res_v;
      sc.pos[i] = r.seg_pos0 + r.e0 + i + m.anchors_before;
    }
  }
  sc.res_k.resize(static_cast<size_t>(nk));
  sc.res_v.resize(static_cast<size_t>(nv));
}

namespace {

// Scores of the anchor approximation: gamma_t * (q . a_K(t)); with pre-RoPE
// keys q . RoPE_t(gamma a) = gamma * sum_i C_i cos(t theta_i) + S_i sin(t theta_i).
template <class Ops>
void score_anchor_approx(const CompressedQueries& cq, int64_t k, int64_t D, const EntryRange& r,
                         EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nq = cq.nq, half = D / 2;
  float* s = sc.s.data();
  if (cq.rope) {
    sc.cs_row.resize(static_cast<size_t>(2 * D));
    float* row = sc.cs_row.data();  // the pair products' cos | sin, or the anchor rotated (split rows)
    float *c = row + D, *sn = row + D + half;  // the position's angles
    for (int64_t i = 0; i < n; ++i) {
      cq.table->angles(sc.pos[i] + cq.rope->position_offset, c, sn);
      if (cq.cs) {
        std::copy_n(c, half, row);
        std::copy_n(sn, half, row + half);
      } else {
        const uint16_t* a = cq.rope_anchors + sc.ak[i] * D;
        for (int64_t t = 0; t < half; ++t) {
          const float ax = core::half_to_float(a[t]), ay = core::half_to_float(a[half + t]);
          row[t] = ax * c[t] - ay * sn[t];
          row[half + t] = ax * sn[t] + ay * c[t];
        }
      }
      for (int64_t g = 0; g < nq; ++g) {
        const float* x = cq.cs ? cq.cs + (g * k + sc.ak[i]) * D : cq.rope_queries + g * D;
        s[g * n + i] = (!r.masked || sc.pos[i] <= cq.qpos[g]) ? sc.gk_at[i] * Ops::dot(x, row, D) : kNegInf;
      }
    }
    return;
  }
  for (int64_t g = 0; g < nq; ++g)
    Ops::gather_scaled(cq.anchor_dot + g * k, sc.ak.data(), sc.gk_at, n, s + g * n);
  if (r.masked)
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t i = 0; i < n; ++i)
        if (sc.pos[i] > cq.qpos[g]) s[g * n + i] = kNegInf;
}

// Key residuals add (R q) . (scale * level[code]): every residual of the
// chunk decoded, then one dot_matrix against the rotated queries (also for
// pre-RoPE keys whose residuals were coded after RoPE, row.key_rope, q being
// rotated to its position already). Pre-RoPE keys coded as given: each
// residual key is rotated back and to its position once, and shared by every
// query of the group.
template <class Ops>
void add_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                       const compress::ResidualCodec& codec, const EntryRange& r, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nq = cq.nq, D = codec.dim(), cb = codec.code_bytes();
  const int64_t nr = static_cast<int64_t>(sc.res_k.size());
  if (nr == 0) return;
  float* s = sc.s.data();
  sc.codes.resize(static_cast<size_t>(D));
  if (cq.rope && !row.key_rope.enabled) {  // coded before RoPE: rotated to the key's position here
    sc.z.resize(static_cast<size_t>(D));
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t i = sc.res_k[j], slot = r.slot_k0 + j;
      const float scale = core::half_to_float(row.k.scales[slot]);
      codec.decode_levels(&row.k.codes[static_cast<size_t>(slot * cb)], sc.z.data(), sc.codes.data());
      codec.rotation().inverse(sc.z.data(), sc.z.data());
      const int64_t p = sc.pos[i] + cq.rope->position_offset;
      cq.table->rotate(sc.z.data(), cq.rope->style, p);
      for (int64_t g = 0; g < nq; ++g)
        if (s[g * n + i] != kNegInf) s[g * n + i] += scale * Ops::dot(cq.q + g * D, sc.z.data(), D);
    }
    return;
  }
  const ResidualArithmetic& a = arithmetic_of(cq);  // bf16: cq.rq is rounded already
  sc.z.resize(static_cast<size_t>(nr * D));
  sc.zscale.resize(static_cast<size_t>(nr));
  sc.zdot.resize(static_cast<size_t>(nq * nr));
  decode_levels_as(row.k, codec, a, r.slot_k0, nr, sc.z.data(), sc);
  for (int64_t j = 0; j < nr; ++j) sc.zscale[j] = core::half_to_float(row.k.scales[r.slot_k0 + j]) * a.inv_lambda;
  Ops::dot_matrix(cq.rq, nq, sc.z.data(), nr, D, sc.zdot.data());
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t g = 0; g < nq; ++g)
      if (s[g * n + sc.res_k[j]] != kNegInf) s[g * n + sc.res_k[j]] += sc.zscale[j] * sc.zdot[g * nr + j];
}

// Value residuals: rot[g] += sum_j p[g, i_j] * scale_j * level[codes_j], all
// rows at once (bf16: the weights rounded, ResidualArithmetic).
template <class Ops>
void add_value_residuals(const ResidualArithmetic& a, const compress::CompressedRow& row,
                         const compress::ResidualCodec& codec, const EntryRange& r, int64_t nq, PartialView out,
                         EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, D = codec.dim();
  const int64_t nr = static_cast<int64_t>(sc.res_v.size());
  if (nr == 0) return;
  sc.z.resize(static_cast<size_t>(nr * D));
  sc.zdot.resize(static_cast<size_t>(nq * nr));
  decode_levels_as(row.v, codec, a, r.slot_v0, nr, sc.z.data(), sc);
  for (int64_t j = 0; j < nr; ++j) {
    const float scale = core::half_to_float(row.v.scales[r.slot_v0 + j]) * a.inv_lambda;
    for (int64_t g = 0; g < nq; ++g) {
      const float x = sc.s[g * n + sc.res_v[j]] * scale;
      sc.zdot[g * nr + j] = a.bf16 ? core::round_to_bf16(x) : x;
    }
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
  Ops::value_weights(sc.s.data(), sc.gv_at, sc.av.data(), nq, n, k, out.w, sc);
  add_value_residuals<Ops>(arithmetic_of(cq), row, codec, r, nq, out, sc);
  sc.slots_k = static_cast<int64_t>(sc.res_k.size());
  sc.slots_v = static_cast<int64_t>(sc.res_v.size());
}

}  // namespace

void dense_chunk(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                 int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch) {
  HWY_DYNAMIC_DISPATCH(DenseChunk)(q, qpos, nq, K16, V16, n, pos0, D, out, scratch);
}

void dense_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                     const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, PartialView out,
                     float* scratch) {
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

void dense_chunk_rope(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                      const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                      const RopeTable& table, PartialView out, float* scratch) {
  dense_chunk_rope_impl<FastOps>(q, qpos, nq, K16, V16, n, pos0, D, rope, table, out, scratch);
}

void dense_chunk_rope_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                          const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                          const RopeTable& table, PartialView out, float* scratch) {
  dense_chunk_rope_impl<RefOps>(q, qpos, nq, K16, V16, n, pos0, D, rope, table, out, scratch);
}

namespace {
template <class Ops>
void anchors_chunk_impl(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                        PartialView out) {
  // Scores are the exact q . a_j; each anchor's value is its own (gamma = 1).
  for (int64_t g = 0; g < cq.nq; ++g) {
    float* w = out.w + g * k;
    for (int64_t j = 0; j < k; ++j)
      w[j] = (!masked || anchor_pos[j] <= cq.qpos[g]) ? cq.anchor_dot[g * k + j] : kNegInf;
  }
  softmax_stats<Ops>(out.w, cq.nq, k, out.m, out.l);
  // Anchors contribute through w only; acc and rot stay as the caller zeroed them.
}
}  // namespace

void anchors_chunk(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                   PartialView out) {
  anchors_chunk_impl<FastOps>(cq, k, anchor_pos, masked, out);
}

void anchors_chunk_ref(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                       PartialView out) {
  anchors_chunk_impl<RefOps>(cq, k, anchor_pos, masked, out);
}

bool entries_chunk_any_length(const CompressedQueries& cq, bool masked) {
  return !masked && (cq.rope ? cq.rope_anchors != nullptr : cq.anchor_dot4 != nullptr);
}

EntryWorkspace::EntryWorkspace() : scratch_(std::make_unique<EntryScratch>()) {}
EntryWorkspace::~EntryWorkspace() = default;

int64_t EntryWorkspace::bytes() const {
  const EntryScratch& sc = *scratch_;
  const auto n = [](const auto&... v) { return core::bytes_held(v...); };
  const EntryScratch::PreRope& r = sc.rope;
  return static_cast<int64_t>(sizeof(EntryScratch)) + n(sc.s, sc.gk, sc.gv, sc.ak, sc.av, sc.pos, sc.res_k, sc.res_v) +
         n(sc.z, sc.zscale, sc.zdot, sc.codes, sc.cs_row, sc.pt, sc.wa, sc.wb, sc.w4, sc.ml, sc.anchor_ids) +
         n(sc.anchor_ones, sc.run_w, sc.zk, sc.zv, sc.zks, sc.zvs) +
         n(r.qb, r.ksigns, r.zi, r.zrs, r.zero, r.zk_left, r.zks_left, r.res_left);
}

ResidualSlots entries_chunk(const CompressedQueries& cq, const compress::CompressedRow& row,
                            const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                            EntryWorkspace& workspace) {
  EntryScratch& sc = workspace.scratch();
  if (entries_chunk_any_length(cq, range.masked))
    entries_chunk_quads(cq, row, codec, range, out, sc);
  else
    entries_chunk_impl<FastOps>(cq, row, codec, range, out, sc);
  return {sc.slots_k, sc.slots_v};
}

ResidualSlots entries_chunk_ref(const CompressedQueries& cq, const compress::CompressedRow& row,
                                const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                                EntryWorkspace& workspace) {
  EntryScratch& sc = workspace.scratch();
  entries_chunk_impl<RefOps>(cq, row, codec, range, out, sc);
  return {sc.slots_k, sc.slots_v};
}

bool f16_rows_supported(int64_t D) { return HWY_DYNAMIC_DISPATCH(SupportsF16Rows)(D); }

void dot_rows_f16(const float* q, int64_t nq, const uint16_t* A16, int64_t k, int64_t D, float* out) {
  HWY_DYNAMIC_DISPATCH(DotRowsF16)(q, nq, A16, k, D, out);
}

void accumulate_rows_f16_queries(const float* W, int64_t ldw, int64_t nq, int64_t k, const uint16_t* A16,
                                 int64_t D, float* Y, int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(AccumulateRowsF16Queries)(W, ldw, nq, k, A16, D, Y, ldy);
}


void merge_partial(float& m_a, float& l_a, float* acc_a, float* w_a, float* rot_a, float m_b, float l_b,
                   const float* acc_b, const float* w_b, const float* rot_b, int64_t D, int64_t k) {
  if (m_b == kNegInf) return;  // b saw no token
  if (m_a == kNegInf) {        // a saw none: take b (a's buffers may hold anything)
    m_a = m_b;
    l_a = l_b;
    std::copy_n(acc_b, D, acc_a);
    if (w_a && w_b) std::copy_n(w_b, k, w_a);
    if (w_a && !w_b) std::fill_n(w_a, k, 0.0f);
    if (rot_a && rot_b) std::copy_n(rot_b, D, rot_a);
    if (rot_a && !rot_b) std::fill_n(rot_a, D, 0.0f);
    return;
  }
  const float m = std::max(m_a, m_b);
  const float fa = std::exp(m_a - m), fb = std::exp(m_b - m);
  m_a = m;
  l_a = l_a * fa + l_b * fb;
  core::scale_add(fa, acc_a, fb, acc_b, D);
  if (w_a) core::scale_add(fa, w_a, fb, w_b, k);
  if (rot_a && rot_b) core::scale_add(fa, rot_a, fb, rot_b, D);
  if (rot_a && !rot_b)  // b holds no rotated values (a dense chunk): a's only rescale
    for (int64_t d = 0; d < D; ++d) rot_a[d] *= fa;
}

}  // namespace anchorkv::kernels
#endif  // HWY_ONCE
