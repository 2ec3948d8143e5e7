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
#include "kernels/ops_quad-inl.h"
#include "kernels/ops_rope-inl.h"
#include "kernels/ops_residuals-inl.h"
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
HWY_EXPORT(QuadAnchorScoresMax);
HWY_EXPORT(QuadRopeScores);
HWY_EXPORT(SupportsQuadRope);
HWY_EXPORT(RopeQueryBlocks);
HWY_EXPORT(QuadRopeKeyResiduals);
HWY_EXPORT(SplitKeys2Bit);
HWY_EXPORT(SupportsSplitKeys2Bit);
HWY_EXPORT(QuadMax);
HWY_EXPORT(QuadExpScatter);
HWY_EXPORT(SumQuadWeights);
HWY_EXPORT(QuadKeyResiduals2Bit);
HWY_EXPORT(DecodeRows2Bit);
HWY_EXPORT(Supports2BitRows);
HWY_EXPORT(SupportsQuadValueResiduals);
HWY_EXPORT(QuadValueResiduals2Bit);
HWY_EXPORT(SupportsBf16Residuals);
HWY_EXPORT(QuadKeyResiduals2BitBf16);
HWY_EXPORT(QuadValueResiduals2BitBf16);

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The arithmetic a call's residuals take (fp32 where attend() set none).
const ResidualArithmetic& arithmetic_of(const CompressedQueries& cq) {
  static const ResidualArithmetic fp32;
  return cq.arith ? *cq.arith : fp32;
}

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

// ---------------------------------------------------------------- entries

// Anchor ordinals, coefficients, residual flags and (when needed) positions
// of the range's entries. Exact in either path.
void decode_entries(const CompressedQueries& cq, const compress::CompressedRow& row, const EntryRange& r,
                    EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0;
  sc.ak.resize(static_cast<size_t>(n));
  sc.av.resize(static_cast<size_t>(n));
  sc.pos.resize(static_cast<size_t>(n));
  if (!row.lists_positions()) {  // seed layout: fp32 coefficients, read in place
    sc.gk_at = row.k.coef.data() + r.e0;
    sc.gv_at = row.v.coef.data() + r.e0;
  } else {
    sc.gk.resize(static_cast<size_t>(n));
    sc.gv.resize(static_cast<size_t>(n));
    sc.gk_at = sc.gk.data();
    sc.gv_at = sc.gv.data();
  }
  if (row.tight()) {  // 256-entry tables per side: a code indexes its gamma
    if (sc.tight_k_exp != row.k.coef_exp) compress::tight_coef_table(sc.tight_k_exp = row.k.coef_exp, sc.tight_k);
    if (sc.tight_v_exp != row.v.coef_exp) compress::tight_coef_table(sc.tight_v_exp = row.v.coef_exp, sc.tight_v);
    const float *tk = sc.tight_k, *tv = sc.tight_v;
    const uint8_t* ck = &row.k.coef8[static_cast<size_t>(r.e0)];
    const uint8_t* cv = &row.v.coef8[static_cast<size_t>(r.e0)];
    for (int64_t i = 0; i < n; ++i) sc.gk[i] = tk[ck[i]], sc.gv[i] = tv[cv[i]];
  } else if (row.lists_positions()) {  // one SIMD conversion instead of one call per token
    core::f16_to_f32_n(&row.k.coef16[static_cast<size_t>(r.e0)], sc.gk.data(), n);
    core::f16_to_f32_n(&row.v.coef16[static_cast<size_t>(r.e0)], sc.gv.data(), n);
  }
  sc.res_k.resize(static_cast<size_t>(n + kListSlack));
  sc.res_v.resize(static_cast<size_t>(n + kListSlack));
  int64_t nk = 0, nv = 0;
  // Unmasked: the bit fields decoded in SIMD; positions (RoPE) from the seed
  // layout's anchors_before field (the other layouts derive it: the reader).
  // Pre-RoPE keys in the compact and tight layouts: the fields in SIMD as
  // well, then each entry's position from the anchors' (one walk over the
  // list; per entry through EntryMetaReader it was ~6% of a pre-RoPE decode).
  if (!r.masked) {
    MetaOut mo{sc.ak.data(), sc.av.data(), sc.res_k.data(), sc.res_v.data()};
    if (row.tight())
      HWY_DYNAMIC_DISPATCH(DecodeMetaTight)(&row.meta16[static_cast<size_t>(r.e0)], &row.k.coef8[static_cast<size_t>(r.e0)],
                                            &row.v.coef8[static_cast<size_t>(r.e0)], n, &mo);
    else if (row.lists_positions())
      HWY_DYNAMIC_DISPATCH(DecodeMetaCompact)(&row.meta32[static_cast<size_t>(r.e0)], n, &mo);
    else
      HWY_DYNAMIC_DISPATCH(DecodeMetaSeed)(&row.meta[static_cast<size_t>(r.e0)], n, &mo);
    nk = mo.nk, nv = mo.nv;
    const int64_t p0 = r.seg_pos0 + r.e0;
    if (cq.rope && !row.lists_positions()) {
      const uint64_t* w = &row.meta[static_cast<size_t>(r.e0)];
      for (int64_t i = 0; i < n; ++i) sc.pos[i] = p0 + i + compress::unpack_meta(w[i]).anchors_before;
    } else if (cq.rope && n > 0) {  // anchor j has anchor_pos[j] - j entries before it
      const int32_t* ap = row.anchor_pos.data();
      int64_t j = row.meta_at(r.e0).anchors_before;
      for (int64_t i = 0; i < n; ++i) {
        while (j < row.n_anchor && ap[j] - j <= r.e0 + i) ++j;
        sc.pos[i] = p0 + i + j;
      }
    }
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

// Scales of residual slots [slot0, slot0 + nr) of one side, times `factor`
// (ResidualArithmetic::inv_lambda where its levels apply, else 1).
void residual_scales(const compress::CompressedSide& side, int64_t slot0, int64_t nr, float factor,
                     std::vector<float>& out) {
  out.resize(static_cast<size_t>(nr));
  if (nr > 0) core::f16_to_f32_n(side.scales.data() + slot0, out.data(), nr);
  if (factor != 1.0f)
    for (float& x : out) x *= factor;
}

// Residual rows of one side decoded to their unscaled levels (z [nr, D]),
// once per tile and shared by every query.
void decode_residual_rows(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                          int64_t slot0, int64_t nr, core::UninitVector<float>& z, EntryScratch& sc) {
  const int64_t D = codec.dim(), cb = codec.code_bytes();
  z.resize(static_cast<size_t>(nr * D));
  if (nr == 0) return;
  if (codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(Supports2BitRows)(D))
    return HWY_DYNAMIC_DISPATCH(DecodeRows2Bit)(side.codes.data(), cb, slot0, nr, codec.levels().data(), D,
                                                z.data());
  sc.codes.resize(static_cast<size_t>(D));
  for (int64_t j = 0; j < nr; ++j)
    codec.decode_levels(&side.codes[static_cast<size_t>((slot0 + j) * cb)], &z[j * D], sc.codes.data());
}

// The quad's queries rotated back to the start of each block of positions
// the sub-tile's n entries touch (sc.rope.qb, first block sc.rope.qb0). Positions
// increase with the entry (anchors_before never decreases, checked on
// load), so the first and last entries bound them (a scan for the extremes
// took ~4% of a pre-RoPE decode's samples).
void rope_query_blocks(const CompressedQueries& cq, int64_t q0, int64_t n, int64_t D, EntryScratch& sc) {
  const int64_t offset = cq.rope->position_offset;
  assert(std::is_sorted(sc.pos.begin(), sc.pos.begin() + n));
  sc.rope.qb0 = (sc.pos[0] + offset) / kRopeStep;
  const int64_t nb = (sc.pos[n - 1] + offset) / kRopeStep - sc.rope.qb0 + 1;
  sc.rope.qb.resize(static_cast<size_t>(nb * 4 * D));
  HWY_DYNAMIC_DISPATCH(RopeQueryBlocks)
  (cq.rope_queries + q0 * D, D, sc.rope.qb0, nb, cq.table->step_cos.data(), cq.table->step_sin.data(),
   sc.rope.qb.data());
}

// Pre-RoPE key residuals coded as given, once per sub-tile for all quads:
// split rows (sc.zk), each scaled by scale / gamma of its entry so that the
// anchor kernel adds it to the anchor before the rotation and the dot
// (FusedKeys: one rotation and one dot per entry, where a residual of its
// own cost both again). An entry with gamma = 0 (or a ratio past 2^60)
// keeps its residual apart (sc.rope.res_left).
void fuse_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                        const compress::ResidualCodec& codec, const EntryRange& r, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nr = static_cast<int64_t>(sc.res_k.size()), D = codec.dim();
  sc.rope.zi.resize(static_cast<size_t>(n));
  std::fill_n(sc.rope.zi.data(), n, -1);
  sc.rope.zrs.resize(static_cast<size_t>(nr));
  constexpr float kMaxRatio = 0x1p60f;
  for (int64_t j = 0; j < nr; ++j) {
    const int32_t e = sc.res_k[j];
    const float gamma = sc.gk_at[e], ratio = sc.zks[j] / gamma;
    const bool fused = gamma != 0.0f && std::fabs(ratio) <= kMaxRatio;
    sc.rope.zrs[j] = fused ? ratio : 1.0f;
    if (fused) sc.rope.zi[e] = static_cast<int32_t>(j);
  }
  // the ratios ride on the levels: no pass over the rows
  split_key_residuals(row.k, codec, cq.rope->style, r.slot_k0, nr, true, sc.zk, sc, sc.rope.zrs.data());
  sc.rope.zero.assign(static_cast<size_t>(D), 0.0f);
  sc.rope.zk_left.clear();
  sc.rope.zks_left.clear();
  sc.rope.res_left.resize(0);
  for (int64_t j = 0; j < nr; ++j) {
    const int32_t e = sc.res_k[j];
    if (sc.rope.zi[e] == j) continue;
    const float* z = &sc.zk[static_cast<size_t>(j * D)];
    sc.rope.zk_left.insert(sc.rope.zk_left.end(), z, z + D);
    sc.rope.zks_left.push_back(sc.zks[j]);
    sc.rope.res_left.push_back(e);
  }
}

// The quad's pre-RoPE scores over the sub-tile, key residuals included; m4
// their maxima.
void quad_rope_scores(const CompressedQueries& cq, const compress::CompressedRow& row,
                      const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, EntryScratch& sc,
                      float* m4) {
  const int64_t n = r.e1 - r.e0, D = codec.dim(), offset = cq.rope->position_offset;
  const bool fuse = !sc.res_k.empty() && !row.key_rope.enabled;
  if (fuse && sc.zk.empty()) fuse_key_residuals(cq, row, codec, r, sc);
  rope_query_blocks(cq, q0, n, D, sc);
  const FusedKeys fk = fuse ? FusedKeys{sc.rope.zi.data(), sc.zk.data(), sc.rope.zero.data()} : FusedKeys{};
  const float *near_cos = cq.table->near_cos.data(), *near_sin = cq.table->near_sin.data();
  float* s4 = sc.s.data();
  HWY_DYNAMIC_DISPATCH(QuadRopeScores)
  (cq.rope_anchors, sc.rope.qb.data(), sc.rope.qb0, D, sc.ak.data(), sc.gk_at, sc.pos.data(), offset,
   near_cos, near_sin, &fk, n, s4);
  HWY_DYNAMIC_DISPATCH(QuadMax)(s4, n, m4);
  const EntryScratch::PreRope& pr = sc.rope;
  if (fuse && !pr.res_left.empty()) {
    HWY_DYNAMIC_DISPATCH(QuadRopeKeyResiduals)
    (pr.zk_left.data(), pr.zks_left.data(), pr.res_left.data(), static_cast<int64_t>(pr.res_left.size()),
     pr.qb.data(), pr.qb0, D, sc.pos.data(), offset, near_cos, near_sin, s4, m4);
  }
}

// Key residuals of the quad at q0 added to its scores s4 (keys after RoPE,
// or coded at their positions: key_rope); m4 raised to the largest score
// they change.
void add_quad_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                            const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, int64_t gn,
                            EntryScratch& sc, float* m4, LinesAhead& ahead) {
  const int64_t nr = static_cast<int64_t>(sc.res_k.size()), D = codec.dim();
  if (nr == 0) return;
  float* s4 = sc.s.data();
  if (const ResidualArithmetic& a = arithmetic_of(cq); a.bf16)
    return HWY_DYNAMIC_DISPATCH(QuadKeyResiduals2BitBf16)(row.k.codes.data(), codec.code_bytes(), r.slot_k0,
                                                          sc.zks.data(), sc.res_k.data(), nr, a.pairs,
                                                          cq.rq + q0 * D, D, s4, m4, &ahead);
  if (codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(Supports2BitRows)(D))  // decoded in registers
    return HWY_DYNAMIC_DISPATCH(QuadKeyResiduals2Bit)(
        row.k.codes.data(), codec.code_bytes(), r.slot_k0, sc.zks.data(), sc.res_k.data(), nr,
        codec.levels().data(), cq.rq + q0 * D, D, s4, m4, &ahead);
  if (sc.zk.empty()) decode_residual_rows(row.k, codec, r.slot_k0, nr, sc.zk, sc);
  sc.zdot.resize(static_cast<size_t>(4 * nr));
  core::dot_matrix(cq.rq + q0 * D, gn, D, sc.zk.data(), nr, D, D, sc.zdot.data(), nr);
  for (int64_t j = 0; j < nr; ++j) {
    float* s = &s4[sc.res_k[j] * 4];
    for (int64_t g = 0; g < gn; ++g) s[g] += sc.zks[j] * sc.zdot[g * nr + j];
    for (int g = 0; g < 4; ++g) m4[g] = std::max(m4[g], s[g]);
  }
}

// Entries per pass of the quad kernel: a sub-tile's scores, anchor ordinals
// and residual lists stay in L1, and each stream of the cache (metadata,
// coefficients, codes) is read at the pace of the arithmetic. Whole tiles per
// pass read each stream in a burst that the prefetchers did not hide. (512
// on an Intel Sapphire Rapids machine; 1024 is ~10% faster on AMD Zen 5 and
// requests the next sub-tile's lines twice as far ahead.)
constexpr int64_t kSubTile = 1024;

// A quad's softmax runs over the sub-tiles of a tile with a shift m4 per
// query that is at most kHeadroom below the scores seen (exps up to e^16,
// sums far from overflow), so later sub-tiles rarely move it. When one does,
// to its maximum m_new[g], what the quad has summed for g so far (l4, the
// interleaved anchor weights W0 / W1, rot) is scaled by exp(old - new).
// (Raising at every new maximum made the kernel ~1.5x slower.)
constexpr float kHeadroom = 16.0f;

// What a quad has summed over a tile's sub-tiles so far.
struct QuadRun {
  float* m4;         // [4] shifts
  float* l4;         // [4] sums of exp(score - shift)
  float *W0, *W1;    // [k, 4] interleaved anchor weights (even / odd entries)
  float* rot;        // [gn, D] rotated-domain residual values
};

void raise_quad_shifts(const float* m_new, int64_t gn, int64_t k, int64_t D, const QuadRun& q) {
  float *m4 = q.m4, *l4 = q.l4, *W0 = q.W0, *W1 = q.W1, *rot = q.rot;
  float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  bool raised = false;
  for (int g = 0; g < 4; ++g) {
    if (!(m_new[g] > m4[g] + kHeadroom)) continue;  // -inf + 16 = -inf: the first sub-tile sets m4
    // a lane's first shift (m4 = -inf) finds its sums, weights and rot still
    // zero: nothing to rescale (every tile's first sub-tile)
    if (m4[g] != kNegInf) {
      f[g] = std::exp(m4[g] - m_new[g]);
      raised = true;
    }
    m4[g] = m_new[g];
  }
  if (!raised) return;
  for (int g = 0; g < 4; ++g) l4[g] *= f[g];
  for (int64_t j = 0; j < k; ++j)
    for (int g = 0; g < 4; ++g) W0[j * 4 + g] *= f[g], W1[j * 4 + g] *= f[g];
  for (int64_t g = 0; g < gn; ++g)
    for (int64_t d = 0; d < D; ++d) rot[g * D + d] *= f[g];
}

// One quad (queries q0 .. q0 + gn) over the sub-tile whose entries
// decode_entries left in sc: scores, key residuals, the running maxima,
// exps with their value weights into W0 / W1, and value residuals into rot.
void quad_sub_tile(const CompressedQueries& cq, const compress::CompressedRow& row,
                   const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, int64_t gn, bool fused_v,
                   const QuadRun& run, LinesAhead& ahead, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, D = codec.dim(), k = row.n_anchor;
  const int64_t nrv = static_cast<int64_t>(sc.res_v.size());
  float* s4 = sc.s.data();
  float m_sub[4];
  if (cq.rope)
    quad_rope_scores(cq, row, codec, r, q0, sc, m_sub);
  else
    HWY_DYNAMIC_DISPATCH(QuadAnchorScoresMax)(cq.anchor_dot4 + q0 * k, sc.ak.data(), sc.gk_at, n, s4, m_sub);
  if (!cq.rope || row.key_rope.enabled) add_quad_key_residuals(cq, row, codec, r, q0, gn, sc, m_sub, ahead);
  raise_quad_shifts(m_sub, gn, k, D, run);
  float l_sub[4];
  HWY_DYNAMIC_DISPATCH(QuadExpScatter)(s4, n, run.m4, l_sub, sc.av.data(), sc.gv_at, run.W0, run.W1, &ahead);
  for (int g = 0; g < 4; ++g) run.l4[g] += l_sub[g];
  if (nrv == 0) return;
  // rot[g] += sum_j p[g, i_j] * scale_j * z_j
  if (const ResidualArithmetic& a = arithmetic_of(cq); a.bf16)
    return HWY_DYNAMIC_DISPATCH(QuadValueResiduals2BitBf16)(row.v.codes.data(), codec.code_bytes(), r.slot_v0,
                                                            nrv, a.pairs, s4, sc.res_v.data(), sc.zvs.data(),
                                                            gn, D, run.rot, &ahead);
  if (fused_v)
    return HWY_DYNAMIC_DISPATCH(QuadValueResiduals2Bit)(row.v.codes.data(), codec.code_bytes(), r.slot_v0,
                                                        nrv, codec.levels().data(), s4, sc.res_v.data(),
                                                        sc.zvs.data(), gn, D, run.rot, &ahead);
  sc.zdot.resize(static_cast<size_t>(4 * nrv));
  for (int64_t g = 0; g < gn; ++g)
    for (int64_t j = 0; j < nrv; ++j) sc.zdot[g * nrv + j] = s4[sc.res_v[j] * 4 + g] * sc.zvs[j];
  core::accumulate_rows(sc.zdot.data(), nrv, sc.zv.data(), nrv, gn, D, run.rot, D);
}

// The streams of entries [e0, e1) (metadata, coefficients) and of their
// residual codes from slot_k / slot_v on (nk, nv of them, estimated).
LinesAhead lines_of_entries(const compress::CompressedRow& row, int64_t cb, int64_t e0, int64_t e1, int64_t slot_k,
                            int64_t nk, int64_t slot_v, int64_t nv) {
  LinesAhead out;
  if (e0 >= e1) return out;
  const int64_t n = e1 - e0;
  const size_t e = static_cast<size_t>(e0);
  if (row.tight()) {
    out.add(&row.meta16[e], 2 * n);
    out.add(&row.k.coef8[e], n);
    out.add(&row.v.coef8[e], n);
  } else if (row.lists_positions()) {
    out.add(&row.meta32[e], 4 * n);
    out.add(&row.k.coef16[e], 2 * n);
    out.add(&row.v.coef16[e], 2 * n);
  } else {
    out.add(&row.meta[e], 8 * n);
    out.add(&row.k.coef[e], 4 * n);
    out.add(&row.v.coef[e], 4 * n);
  }
  nk = std::min(nk, row.k.n_residual() - slot_k);
  nv = std::min(nv, row.v.n_residual() - slot_v);
  if (nk > 0) out.add(&row.k.codes[static_cast<size_t>(slot_k * cb)], nk * cb);
  if (nv > 0) out.add(&row.v.codes[static_cast<size_t>(slot_v * cb)], nv * cb);
  return out;
}

// The fast path for the common decode case (no causal mask inside the
// segment): queries in quads, each entry's four scores in one vector
// (token-major), anchor scores from the quad's interleaved table, residuals
// decoded once per sub-tile for all quads, one online softmax per quad over
// the tile's sub-tiles. Same arithmetic as entries_chunk_impl up to
// summation order and the rescaling of partial sums.
void entries_chunk_quads(const CompressedQueries& cq, const compress::CompressedRow& row,
                         const compress::ResidualCodec& codec, const EntryRange& r, PartialView out,
                         EntryScratch& sc) {
  const int64_t nq = cq.nq, D = codec.dim(), k = row.n_anchor, quads = (nq + 3) / 4;
  const ResidualArithmetic& arith = arithmetic_of(cq);
  const bool fused_v = arith.bf16 || (codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(SupportsQuadValueResiduals)(D));
  sc.s.resize(static_cast<size_t>(4 * kSubTile));
  sc.wa.assign(static_cast<size_t>(quads * 4 * k), 0.0f);
  sc.wb.assign(sc.wa.size(), 0.0f);
  sc.ml.resize(static_cast<size_t>(8 * quads));  // per quad: four shifts, then four sums
  for (int64_t qi = 0; qi < quads; ++qi) {
    std::fill_n(&sc.ml[8 * qi], 4, kNegInf);
    std::fill_n(&sc.ml[8 * qi + 4], 4, 0.0f);
  }
  std::fill_n(out.acc, nq * D, 0.0f);
  std::fill_n(out.rot, nq * D, 0.0f);
  EntryRange sub = r;
  for (int64_t e = r.e0; e < r.e1; e += kSubTile) {
    sub.e0 = e;
    sub.e1 = std::min(r.e1, e + kSubTile);
    decode_entries(cq, row, sub, sc);
    const int64_t nrk = static_cast<int64_t>(sc.res_k.size()), nrv = static_cast<int64_t>(sc.res_v.size());
    // pre-RoPE keys coded as given are scored in fp32 (fuse_key_residuals)
    const bool keys_as_given = cq.rope && !row.key_rope.enabled;
    residual_scales(row.k, sub.slot_k0, nrk, keys_as_given ? 1.0f : arith.inv_lambda, sc.zks);
    residual_scales(row.v, sub.slot_v0, nrv, arith.inv_lambda, sc.zvs);
    sc.zk.clear();
    if (!fused_v) decode_residual_rows(row.v, codec, sub.slot_v0, nrv, sc.zv, sc);
    // the next sub-tile's lines (the next tile's first, up to r.ahead_end),
    // with half again this one's residual count
    const int64_t ahead_end = std::max(r.e1, r.ahead_end);
    LinesAhead ahead =
        lines_of_entries(row, codec.code_bytes(), sub.e1, std::min(ahead_end, sub.e1 + kSubTile),
                         sub.slot_k0 + nrk, nrk + nrk / 2 + 4, sub.slot_v0 + nrv, nrv + nrv / 2 + 4);
    for (int64_t qi = 0; qi < quads; ++qi) {
      const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
      const QuadRun run{&sc.ml[8 * qi], &sc.ml[8 * qi + 4], &sc.wa[qi * 4 * k], &sc.wb[qi * 4 * k], out.rot + q0 * D};
      quad_sub_tile(cq, row, codec, sub, q0, gn, fused_v, run, ahead, sc);
    }
    sub.slot_k0 += nrk;
    sub.slot_v0 += nrv;
  }
  sc.slots_k = sub.slot_k0 - r.slot_k0;
  sc.slots_v = sub.slot_v0 - r.slot_v0;
  for (int64_t qi = 0; qi < quads; ++qi) {
    const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
    std::copy_n(&sc.ml[8 * qi], gn, out.m + q0);
    std::copy_n(&sc.ml[8 * qi + 4], gn, out.l + q0);
    HWY_DYNAMIC_DISPATCH(SumQuadWeights)(&sc.wa[qi * 4 * k], &sc.wb[qi * 4 * k], k, gn, out.w + q0 * k);
  }
}

}  // namespace

void split_key_residuals(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                         RopeStyle style, int64_t slot0, int64_t nr, bool simd, core::UninitVector<float>& z,
                         EntryScratch& sc, const float* row_scale) {
  const int64_t D = codec.dim(), cb = codec.code_bytes();
  z.resize(static_cast<size_t>(nr * D));
  const core::Rotation& rot = codec.rotation();
  if (simd && codec.bits() == 2 && rot.is_hadamard() && HWY_DYNAMIC_DISPATCH(SupportsSplitKeys2Bit)(D)) {
    sc.z.resize(static_cast<size_t>(D));  // as Rotation::inverse: norm * sign, then split
    const float norm = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t d = 0; d < D; ++d) sc.z[d] = norm * rot.signs()[d];
    sc.rope.ksigns.resize(static_cast<size_t>(D));
    core::rope_split(sc.z.data(), D, style, sc.rope.ksigns.data());
    return HWY_DYNAMIC_DISPATCH(SplitKeys2Bit)(side.codes.data(), cb, slot0, nr, codec.levels().data(),
                                               sc.rope.ksigns.data(), style == RopeStyle::kNeox, row_scale, D,
                                               z.data());
  }
  sc.codes.resize(static_cast<size_t>(D));
  sc.z.resize(static_cast<size_t>(D));
  for (int64_t j = 0; j < nr; ++j) {
    codec.decode_levels(&side.codes[static_cast<size_t>((slot0 + j) * cb)], sc.z.data(), sc.codes.data());
    if (row_scale)
      for (int64_t d = 0; d < D; ++d) sc.z[d] *= row_scale[j];
    rot.inverse(sc.z.data(), sc.z.data());
    core::rope_split(sc.z.data(), D, style, &z[static_cast<size_t>(j * D)]);
  }
}

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

void entries_chunk(const CompressedQueries& cq, const compress::CompressedRow& row,
                   const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                   EntryScratch& scratch) {
  if (entries_chunk_any_length(cq, range.masked))
    return entries_chunk_quads(cq, row, codec, range, out, scratch);
  entries_chunk_impl<FastOps>(cq, row, codec, range, out, scratch);
}

void entries_chunk_ref(const CompressedQueries& cq, const compress::CompressedRow& row,
                       const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                       EntryScratch& scratch) {
  entries_chunk_impl<RefOps>(cq, row, codec, range, out, scratch);
}

ResidualArithmetic residual_arithmetic(const compress::ResidualCodec& codec, bool bf16) {
  ResidualArithmetic a;
  const std::span<const float> L = codec.levels();
  a.bf16 = bf16 && codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(SupportsBf16Residuals)(codec.dim());
  if (!a.bf16) {
    std::copy(L.begin(), L.end(), a.levels);
    return a;
  }
  // lambda puts the largest level on q / 128, exact in bf16 (8 significant
  // bits), and q is chosen so the other levels round least.
  float top = 0.0f;
  for (float x : L) top = std::max(top, std::fabs(x));
  float best_lambda = 1.0f, best_err = std::numeric_limits<float>::infinity();
  for (int q = 128; q < 256; ++q) {
    const float lambda = static_cast<float>(q) / 128.0f / top;
    float err = 0.0f;
    for (float x : L)
      if (const float y = lambda * x; y != 0.0f) err = std::max(err, std::fabs(core::round_to_bf16(y) - y) / std::fabs(y));
    if (err < best_err) best_err = err, best_lambda = lambda;
  }
  for (int i = 0; i < 4; ++i) a.levels[i] = core::round_to_bf16(best_lambda * L[static_cast<size_t>(i)]);
  a.inv_lambda = 1.0f / best_lambda;
  for (uint32_t n = 0; n < 16; ++n)
    a.pairs[n] = (core::f32_bits(a.levels[n & 3]) >> 16) | (core::f32_bits(a.levels[n >> 2]) & 0xffff0000u);
  return a;
}

bool f16_rows_supported(int64_t D) { return HWY_DYNAMIC_DISPATCH(SupportsF16Rows)(D); }
bool quad_rope_supported(int64_t D) { return HWY_DYNAMIC_DISPATCH(SupportsQuadRope)(D); }

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
