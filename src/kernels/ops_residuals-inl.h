// Attention ops: 2-bit residual codes decoded in registers, scored against a
// quad of rotated queries (keys) and summed with its weights (values).
// A per-target "-inl.h" header of kernels/quad_entries.cc (the only file
// that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_RESIDUALS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_RESIDUALS_INL_H_
#undef ANCHORKV_KERNELS_OPS_RESIDUALS_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_RESIDUALS_INL_H_
#endif

#include "core/vec_array-inl.h"
#include "hwy/highway.h"
#include "kernels/ops_quad-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// 2-bit residual codes (4 per byte, code i in bits 2 (i % 4) of byte i / 4)
// decoded N at a time: one broadcast, a per-lane shift and mask, then a lane
// permutation of the 4 levels. Needs 4 <= N <= 16.
struct Levels2Bit {
  static bool supported(int64_t D) {
    const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
    return N >= 4 && N <= 16 && D % N == 0;
  }
  explicit Levels2Bit(const float* levels) {
    // At least 4 entries: the scalar target compiles this too (never constructed there: supported() is false).
    // The levels repeat every 4 lanes: vpermps reads only an index's low
    // bits, so on AVX-512 the codes above a lane's own need no mask.
    HWY_ALIGN float table[hn::MaxLanes(DF()) < 4 ? 4 : hn::MaxLanes(DF())] = {};
    for (size_t i = 0; i < hn::Lanes(df); ++i) table[i] = levels[i % 4];
    lv_.set(0, hn::Load(df, table));
    shifts_.set(0, hn::ShiftLeft<1>(hn::Iota(du, 0)));
  }
  HWY_INLINE hn::Vec<DF> levels() const { return lv_.get(0); }
  // The four levels times s (a row's scale: the transforms after are linear).
  HWY_INLINE void scale_levels(float s) { lv_.set(0, hn::Mul(lv_.get(0), hn::Set(df, s))); }
  HWY_INLINE hn::Vec<DF> at(const uint8_t* HWY_RESTRICT codes, int64_t d) const {
    uint32_t w = 0;
    std::memcpy(&w, codes + d / 4, hn::Lanes(df) / 4);
#if ANCHORKV_AVX512_TARGET
    return hn::Vec<DF>{_mm512_permutexvar_ps(hn::Shr(hn::Set(du, w), shifts_.get(0)).raw, levels().raw)};
#else
    const auto idx = hn::BitCast(di, hn::And(hn::Shr(hn::Set(du, w), shifts_.get(0)), hn::Set(du, 3u)));
    return hn::TableLookupLanes(levels(), hn::IndicesFromVec(df, idx));
#endif
  }
  DF df;
  hn::RebindToUnsigned<DF> du;
  hn::RebindToSigned<DF> di;
  core::HWY_NAMESPACE::VecArray<DF, 1> lv_;
  core::HWY_NAMESPACE::VecArray<hn::RebindToUnsigned<DF>, 1> shifts_;
};

#if ANCHORKV_AVX512_TARGET
// One butterfly stage of the Walsh-Hadamard transform between vectors kDV
// apart (a + b below, a - b above), on a row of kV vectors in registers.
template <int kDV, int kV>
HWY_INLINE void HadamardAcross(hn::Vec<DF>* v) {
  for (int i = 0; i < kV; ++i)
    if ((i & kDV) == 0) {
      const auto a = v[i], b = v[i + kDV];
      v[i] = hn::Add(a, b);
      v[i + kDV] = hn::Sub(a, b);
    }
}

// Pre-RoPE key residuals coded as given, 2-bit codes and a Hadamard rotation
// (codec rotation R^T y = signs * H y / sqrt(D)), decoded straight into the
// split domain (core::rope_split) in registers: Z[j] = split(R^T levels(codes
// of slot slot0 + j)). Splitting permutes index bits, and a Hadamard
// transform commutes with a permutation of index bits applied to its input
// and output, so the transform runs on split rows with its stages taken in
// the order that matches core::fwht's: the bits are those of
// rotation().inverse() followed by core::rope_split. signs: the rotation's
// signs times 1 / sqrt(D), split. D = 16 kV.
template <int kV>
void SplitKeys2BitD(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0, int64_t nr,
                    const float* HWY_RESTRICT levels, const float* HWY_RESTRICT signs, bool neox,
                    const float* HWY_RESTRICT row_scale, float* HWY_RESTRICT Z) {
  const DF df;
  const Levels2Bit unscaled(levels);
  const HadamardWithin<DF> within(df);  // lanes 1 .. 8 apart
  // Normal pairing: split lane l of vector u < kV/2 is element 2 (16u + l), of
  // u >= kV/2 element 2 (16(u - kV/2) + l) + 1: bits 4l (+ 2) of the 8 bytes
  // at 8 (u mod kV/2); lanes 0-7 read the low word, 8-15 the high one.
  alignas(64) static constexpr int32_t kHalves[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  alignas(64) static constexpr int32_t kShift[16] = {0, 4, 8, 12, 16, 20, 24, 28,
                                                     0, 4, 8, 12, 16, 20, 24, 28};
  const __m512i halves = _mm512_load_si512(kHalves), shift_x = _mm512_load_si512(kShift);
  const __m512i shift_y = _mm512_add_epi32(shift_x, _mm512_set1_epi32(2));
  for (int64_t j = 0; j < nr; ++j) {
    const uint8_t* c = codes + (slot0 + j) * cb;
    Levels2Bit dec = unscaled;  // a row's scale on its four levels (the transform is linear)
    if (row_scale) dec.scale_levels(row_scale[j]);
    hn::Vec<DF> v[kV];
    if (neox) {  // split is the identity: natural order, core::fwht's stages
      for (int u = 0; u < kV; ++u) v[u] = dec.at(c, 16 * u);
      for (auto& x : v) x = within.apply(x);
      HadamardAcross<1, kV>(v);
      HadamardAcross<2, kV>(v);
      if constexpr (kV == 8) HadamardAcross<4, kV>(v);
    } else {
      for (int u = 0; u < kV / 2; ++u) {
        uint64_t w;
        std::memcpy(&w, c + 8 * u, 8);
        const __m512i words = _mm512_permutexvar_epi32(halves, _mm512_set1_epi64(static_cast<long long>(w)));
        v[u] = hn::Vec<DF>{_mm512_permutexvar_ps(_mm512_srlv_epi32(words, shift_x), dec.levels().raw)};
        v[u + kV / 2] = hn::Vec<DF>{_mm512_permutexvar_ps(_mm512_srlv_epi32(words, shift_y), dec.levels().raw)};
      }
      // core::fwht's stage h = 1 pairs elements 2i, 2i + 1: split rows kV/2 vectors apart
      HadamardAcross<kV / 2, kV>(v);
      for (auto& x : v) x = within.apply(x);            // h = 2 .. 16
      HadamardAcross<1, kV>(v);                         // h = 32
      if constexpr (kV == 8) HadamardAcross<2, kV>(v);  // h = 64
    }
    for (int u = 0; u < kV; ++u)
      hn::StoreU(hn::Mul(v[u], hn::LoadU(df, signs + 16 * u)), df, Z + j * kV * 16 + 16 * u);
  }
}
#endif

void SplitKeys2Bit(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0, int64_t nr,
                   const float* HWY_RESTRICT levels, const float* HWY_RESTRICT signs, bool neox,
                   const float* HWY_RESTRICT row_scale, int64_t D, float* HWY_RESTRICT Z) {
#if ANCHORKV_AVX512_TARGET
  if (D == 128) return SplitKeys2BitD<8>(codes, cb, slot0, nr, levels, signs, neox, row_scale, Z);
  if (D == 64) return SplitKeys2BitD<4>(codes, cb, slot0, nr, levels, signs, neox, row_scale, Z);
#endif
  (void)codes, (void)cb, (void)slot0, (void)nr, (void)levels, (void)signs, (void)neox, (void)row_scale,
      (void)D, (void)Z;
  HWY_ASSERT(false);  // callers check SupportsSplitKeys2Bit
}

bool SupportsSplitKeys2Bit(int64_t D) { return ANCHORKV_AVX512_TARGET && (D == 128 || D == 64); }

// Key residuals of a quad, decoded in registers: for each residual j (slot
// slot0 + j, entry res[j]) s4[res[j] * 4 + g] += zscale[j] * (rq4[g] . levels(codes)),
// and m4[g] raised to the largest score so changed.
// rq4: [4, D] rotated queries (zero rows past the quad's last query).
// ahead: lines requested while the residuals compute (LinesAhead).
void QuadKeyResiduals2Bit(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0,
                          const float* HWY_RESTRICT zscale, const int32_t* HWY_RESTRICT res, int64_t nr,
                          const float* HWY_RESTRICT levels, const float* HWY_RESTRICT rq4, int64_t D,
                          float* HWY_RESTRICT s4, float* HWY_RESTRICT m4, LinesAhead* HWY_RESTRICT ahead) {
  (void)ahead;  // the four-at-a-time loop requests lines (AVX-512)
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const Levels2Bit dec(levels);
  int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  auto mx = hn::LoadU(d4, m4);  // the maxima over the scores changed
#endif
#if ANCHORKV_AVX512_TARGET
  // Four residuals at once: each query row is loaded once for all four, and
  // their 16 dots are summed in one pass (SumsOf16).
  for (; j + 4 <= nr; j += 4) {
    ahead->request_one();  // two lines per four residuals (see QuadExpScatter)
    ahead->request_one();
    const uint8_t* c = codes + (slot0 + j) * cb;
    hn::Vec<DF> acc[16];
    for (auto& a : acc) a = hn::Zero(df);
    for (int64_t d = 0; d < D; d += N) {
      const auto q0 = hn::LoadU(df, rq4 + d), q1 = hn::LoadU(df, rq4 + D + d);
      const auto q2 = hn::LoadU(df, rq4 + 2 * D + d), q3 = hn::LoadU(df, rq4 + 3 * D + d);
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {
        const auto z = dec.at(c + e * cb, d);
        acc[e * 4] = hn::MulAdd(q0, z, acc[e * 4]);
        acc[e * 4 + 1] = hn::MulAdd(q1, z, acc[e * 4 + 1]);
        acc[e * 4 + 2] = hn::MulAdd(q2, z, acc[e * 4 + 2]);
        acc[e * 4 + 3] = hn::MulAdd(q3, z, acc[e * 4 + 3]);
      }
    }
    alignas(64) float dots[16];
    hn::Store(hn::Mul(SumsOf16(acc), SpreadFour(zscale + j)), df, dots);
    for (int e = 0; e < 4; ++e) {
      float* s = s4 + res[j + e] * 4;
      const auto v = hn::Add(hn::LoadU(d4, s), hn::Load(d4, dots + 4 * e));
      hn::StoreU(v, d4, s);
      mx = hn::Max(mx, v);
    }
  }
#endif
  for (; j < nr; ++j) {
    const uint8_t* c = codes + (slot0 + j) * cb;
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (int64_t d = 0; d < D; d += N) {
      const auto z = dec.at(c, d);
      a0 = hn::MulAdd(hn::LoadU(df, rq4 + d), z, a0);
      a1 = hn::MulAdd(hn::LoadU(df, rq4 + D + d), z, a1);
      a2 = hn::MulAdd(hn::LoadU(df, rq4 + 2 * D + d), z, a2);
      a3 = hn::MulAdd(hn::LoadU(df, rq4 + 3 * D + d), z, a3);
    }
    float* s = s4 + res[j] * 4;
#if HWY_TARGET == HWY_SCALAR
    s[0] += zscale[j] * hn::GetLane(a0), s[1] += zscale[j] * hn::GetLane(a1);
    s[2] += zscale[j] * hn::GetLane(a2), s[3] += zscale[j] * hn::GetLane(a3);
    for (int g = 0; g < 4; ++g) m4[g] = std::max(m4[g], s[g]);
#else
    const auto v = hn::MulAdd(SumsOf4(a0, a1, a2, a3), hn::Set(d4, zscale[j]), hn::LoadU(d4, s));
    hn::StoreU(v, d4, s);
    mx = hn::Max(mx, v);
#endif
  }
#if HWY_TARGET != HWY_SCALAR
  hn::StoreU(mx, d4, m4);
#endif
}

// z[j, :] = levels(codes of slot slot0 + j) for j < nr (2-bit codes).
void DecodeRows2Bit(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0, int64_t nr,
                    const float* HWY_RESTRICT levels, int64_t D, float* HWY_RESTRICT z) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const Levels2Bit dec(levels);
  for (int64_t j = 0; j < nr; ++j) {
    const uint8_t* c = codes + (slot0 + j) * cb;
    for (int64_t d = 0; d < D; d += N) hn::StoreU(dec.at(c, d), df, z + j * D + d);
  }
}

bool Supports2BitRows(int64_t D) { return Levels2Bit::supported(D); }

// Value residuals of a quad, decoded in registers:
//   rot[g, :] += p4[res[j] * 4 + g] * zscale[j] * levels(codes of slot slot0 + j)
// for g < gn, j < nr (p4: the quad's probabilities, token-major).
// Passes of QP queries over PB vectors of D keep QP * PB accumulators in
// registers; each code is decoded once per pass, so a whole quad (QP = 4)
// decodes it once per block of PB vectors. Query rows past gn get zero
// weights and are not stored. ahead: lines requested meanwhile (LinesAhead).
template <int QP, int PB>
HWY_INLINE void QuadValueResidualsPass(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0,
                                       int64_t nr, const float* HWY_RESTRICT levels,
                                       const float* HWY_RESTRICT p4, const int32_t* HWY_RESTRICT res,
                                       const float* HWY_RESTRICT zscale, int64_t gn, int64_t NB,
                                       float* HWY_RESTRICT rot, LinesAhead* HWY_RESTRICT ahead) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), D = NB * N;
  const Levels2Bit dec(levels);
  // The residuals' weights p * scale per query, formed once for every pass
  // and read back as broadcasts from memory (a load each, where a broadcast
  // from a register took the shuffle port the level decode needs).
  constexpr int64_t kBatch = 64;
  HWY_ALIGN float xs[kBatch * 4];
  for (int64_t j0 = 0; j0 < nr; j0 += kBatch) {
    const int64_t jn = std::min(kBatch, nr - j0);
    for (int64_t j = 0; j < jn; ++j)
      for (int64_t q = 0; q < 4; ++q)
        xs[j * 4 + q] = q < gn ? p4[res[j0 + j] * 4 + q] * zscale[j0 + j] : 0.0f;
    for (int64_t g0 = 0; g0 < gn; g0 += QP) {
      const int64_t qn = std::min<int64_t>(QP, gn - g0);
      for (int64_t b0 = 0; b0 < NB; b0 += PB) {
        core::HWY_NAMESPACE::VecArray<DF, QP * PB> a;  // a[q * PB + b]
        for (int q = 0; q < QP; ++q)
          for (int b = 0; b < PB; ++b)
            a.set(q * PB + b, q < qn ? hn::LoadU(df, rot + (g0 + q) * D + (b0 + b) * N) : hn::Zero(df));
        for (int64_t j = 0; j < jn; ++j) {
          const uint8_t* c = codes + (slot0 + j0 + j) * cb;
          if ((j & 1) == 0) ahead->request_one();  // one line per two residuals and block
          core::HWY_NAMESPACE::VecArray<DF, QP> x;
          for (int q = 0; q < QP; ++q) x.set(q, hn::Set(df, xs[j * 4 + (g0 + q) % 4]));  // zero past gn
          for (int b = 0; b < PB; ++b) {
            const auto z = dec.at(c, (b0 + b) * N);
            for (int q = 0; q < QP; ++q) a.set(q * PB + b, hn::MulAdd(x.get(q), z, a.get(q * PB + b)));
          }
        }
        for (int q = 0; q < qn; ++q)
          for (int b = 0; b < PB; ++b) hn::StoreU(a.get(q * PB + b), df, rot + (g0 + q) * D + (b0 + b) * N);
      }
    }
  }
}

// Whether QuadValueResiduals2Bit handles head dim D on this target.
bool SupportsQuadValueResiduals(int64_t D) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return Levels2Bit::supported(D) && D / N <= 8;
}

void QuadValueResiduals2Bit(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0, int64_t nr,
                            const float* HWY_RESTRICT levels, const float* HWY_RESTRICT p4,
                            const int32_t* HWY_RESTRICT res, const float* HWY_RESTRICT zscale, int64_t gn,
                            int64_t D, float* HWY_RESTRICT rot, LinesAhead* HWY_RESTRICT ahead) {
  const int64_t NB = D / static_cast<int64_t>(hn::Lanes(DF()));
  // A whole quad in blocks of four vectors (16 accumulators); otherwise two
  // queries over all of D (NB <= 8).
  if (gn == 4 && NB % 4 == 0)
    return QuadValueResidualsPass<4, 4>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
  switch (NB) {
    case 1:
      return QuadValueResidualsPass<2, 1>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 2:
      return QuadValueResidualsPass<2, 2>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 3:
      return QuadValueResidualsPass<2, 3>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 4:
      return QuadValueResidualsPass<2, 4>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 5:
      return QuadValueResidualsPass<2, 5>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 6:
      return QuadValueResidualsPass<2, 6>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    case 7:
      return QuadValueResidualsPass<2, 7>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
    default:
      return QuadValueResidualsPass<2, 8>(codes, cb, slot0, nr, levels, p4, res, zscale, gn, NB, rot, ahead);
  }
}

#if ANCHORKV_AVX512_TARGET

// 32 2-bit codes (8 bytes) as 16 bf16 pairs of levels (ResidualArithmetic::
// pairs): lane 2m holds dims 2m, 2m + 1 and lane 2m + 1 dims 2m + 16, 2m + 17.
// Qword m of the broadcast codes shifted right by 4m holds nibble m (codes
// 2m, 2m + 1) at the bottom of its low dword and nibble m + 8 at the bottom
// of its high one, and the table lookup reads each dword's low four bits:
// one shift and one shuffle per 32 codes, the order undone by storing the
// queries in it (KeyQueryPairs).
ANCHORKV_BF16_ATTR HWY_INLINE __m512i LevelPairs32(const uint8_t* HWY_RESTRICT c, __m512i shifts, __m512i table) {
  uint64_t w;
  std::memcpy(&w, c, 8);
  return _mm512_permutexvar_epi32(_mm512_srlv_epi64(_mm512_set1_epi64(static_cast<long long>(w)), shifts), table);
}

// The quad's rotated queries (bf16-exact, [4, D]) as bf16 pairs in
// LevelPairs32's lane order: qp[(g * D / 32 + b) * 16 + lane].
ANCHORKV_BF16_ATTR void KeyQueryPairs(const float* HWY_RESTRICT rq4, int64_t D, uint32_t* HWY_RESTRICT qp) {
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  for (int64_t g = 0; g < 4; ++g)
    for (int64_t d = 0; d < D; d += 32) {
      const float* q = rq4 + g * D + d;
      // dword i: (q[2i], q[2i + 1]); exact, the queries being bf16 already
      const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q));
      _mm512_storeu_si512(qp + (g * D + d) / 2, _mm512_permutexvar_epi32(order, reinterpret_cast<const __m512i&>(p)));
    }
}

// QuadKeyResiduals2Bit in bf16 arithmetic (ResidualArithmetic): the same
// contract, with the levels as `pairs` and rq4 rounded to bf16. Four
// residuals at a time, two products per lane and instruction.
ANCHORKV_BF16_ATTR void QuadKeyResidualsBf16(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0,
                                             const float* HWY_RESTRICT zscale, const int32_t* HWY_RESTRICT res,
                                             int64_t nr, const uint32_t* HWY_RESTRICT pairs,
                                             const float* HWY_RESTRICT rq4, int64_t D, float* HWY_RESTRICT s4,
                                             float* HWY_RESTRICT m4, LinesAhead* HWY_RESTRICT ahead) {
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const int64_t NB = D / 32;
  HWY_ALIGN uint32_t qp[4 * 256 / 2];  // D <= 256 (SupportsBf16Residuals)
  KeyQueryPairs(rq4, D, qp);
  const __m512i table = _mm512_loadu_si512(pairs);
  const __m512i shifts = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
  auto mx = hn::LoadU(d4, m4);
  for (int64_t j = 0; j < nr; j += 4) {
    const int64_t ne = std::min<int64_t>(4, nr - j);
    ahead->request_one();  // two lines per four residuals (see QuadExpScatter)
    ahead->request_one();
    const uint8_t* c[4];
    HWY_ALIGN float zs[4] = {};
    for (int64_t e = 0; e < 4; ++e) {
      c[e] = codes + (slot0 + j + std::min(e, ne - 1)) * cb;  // past nr: the last again, not stored
      if (e < ne) zs[e] = zscale[j + e];
    }
    hn::Vec<DF> acc[16];
    for (auto& a : acc) a = hn::Zero(df);
    for (int64_t b = 0; b < NB; ++b) {
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {
        const __m512bh z = reinterpret_cast<__m512bh>(LevelPairs32(c[e] + 8 * b, shifts, table));
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          const __m512i q = _mm512_load_si512(qp + (g * NB + b) * 16);
          acc[e * 4 + g].raw = _mm512_dpbf16_ps(acc[e * 4 + g].raw, z, reinterpret_cast<const __m512bh&>(q));
        }
      }
    }
    HWY_ALIGN float dots[16];
    hn::Store(hn::Mul(SumsOf16(acc), SpreadFour(zs)), df, dots);
    for (int64_t e = 0; e < ne; ++e) {
      float* s = s4 + res[j + e] * 4;
      const auto v = hn::Add(hn::LoadU(d4, s), hn::Load(d4, dots + 4 * e));
      hn::StoreU(v, d4, s);
      mx = hn::Max(mx, v);
    }
  }
  hn::StoreU(mx, d4, m4);
}

// QuadValueResiduals2Bit in bf16 arithmetic (ResidualArithmetic): the same
// contract, with the levels as `pairs` and each weight p * zscale rounded to
// bf16. Residuals go in pairs: lane d of one table lookup holds both
// residuals' levels at dim d, dotted with both weights in one instruction.
// Four queries over four vectors of D per pass (16 accumulators).
ANCHORKV_BF16_ATTR void QuadValueResidualsBf16(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0,
                                               int64_t nr, const uint32_t* HWY_RESTRICT pairs,
                                               const float* HWY_RESTRICT p4, const int32_t* HWY_RESTRICT res,
                                               const float* HWY_RESTRICT zscale, int64_t gn, int64_t D,
                                               float* HWY_RESTRICT rot, LinesAhead* HWY_RESTRICT ahead) {
  const int64_t NB = D / 16;
  const __m512i table = _mm512_loadu_si512(pairs);
  // lane i: code i of the first residual (bits 2i) at bits 0-1, of the second at bits 2-3
  const __m512i first = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i second = _mm512_and_si512(_mm512_sub_epi32(first, _mm512_set1_epi32(2)), _mm512_set1_epi32(31));
  const __m512i low2 = _mm512_set1_epi32(3);
  // words (x[2p, q], x[2p + 1, q]) from x[2p, 0..3], x[2p + 1, 0..3], x[2p + 2, ...], ...
  const __m256i interleave = _mm256_setr_epi16(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  constexpr int64_t kBatch = 64;
  HWY_ALIGN float xf[kBatch * 4];
  HWY_ALIGN uint32_t xs[kBatch / 2 * 4];  // per pair of residuals and query: bf16 (first, second)
  for (int64_t j0 = 0; j0 < nr; j0 += kBatch) {
    const int64_t jn = std::min(kBatch, nr - j0), np = (jn + 1) / 2;
    const __m128 live = _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(gn)), _mm_setr_epi32(0, 1, 2, 3)));
    for (int64_t j = 0; j < 4 * ((np + 1) / 2); ++j) {  // whole conversions: zeros past jn
      const __m128 x = j < jn ? _mm_mul_ps(_mm_loadu_ps(p4 + res[j0 + j] * 4), _mm_set1_ps(zscale[j0 + j]))
                              : _mm_setzero_ps();
      _mm_store_ps(xf + j * 4, _mm_and_ps(x, live));
    }
    for (int64_t p = 0; p < np; p += 2) {  // two pairs per conversion
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_load_ps(xf + p * 8));
      _mm256_store_si256(reinterpret_cast<__m256i*>(xs + p * 4),
                         _mm256_permutexvar_epi16(interleave, reinterpret_cast<const __m256i&>(h)));
    }
    for (int64_t b0 = 0; b0 < NB; b0 += 4) {
      __m512 a[4][4];
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b)
          a[q][b] = q < gn ? _mm512_loadu_ps(rot + q * D + (b0 + b) * 16) : _mm512_setzero_ps();
      for (int64_t p = 0; p < np; ++p) {
        const uint8_t* c0 = codes + (slot0 + j0 + 2 * p) * cb;
        const uint8_t* c1 = 2 * p + 1 < jn ? c0 + cb : c0;  // its weights are zero
        ahead->request_one();
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
          uint32_t w0, w1;
          std::memcpy(&w0, c0 + 4 * (b0 + b), 4);
          std::memcpy(&w1, c1 + 4 * (b0 + b), 4);
          const __m512i t = _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(w0)), first);
          const __m512i u = _mm512_rorv_epi32(_mm512_set1_epi32(static_cast<int>(w1)), second);
          const __m512i idx = _mm512_ternarylogic_epi32(t, u, low2, 0xE4);  // low2 ? t : u, bitwise
          const __m512bh z = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi32(idx, table));
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const __m512i x = _mm512_set1_epi32(static_cast<int>(xs[p * 4 + q]));
            a[q][b] = _mm512_dpbf16_ps(a[q][b], z, reinterpret_cast<const __m512bh&>(x));
          }
        }
      }
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b)
          if (q < gn) _mm512_storeu_ps(rot + q * D + (b0 + b) * 16, a[q][b]);
    }
  }
}
#endif

// Whether the bf16 residual kernels run here for head dim D.
bool SupportsBf16Residuals(int64_t D) {
#if ANCHORKV_AVX512_TARGET
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && D % 64 == 0 && D <= 256;
#else
  (void)D;
  return false;
#endif
}

void QuadKeyResiduals2BitBf16(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0,
                              const float* HWY_RESTRICT zscale, const int32_t* HWY_RESTRICT res, int64_t nr,
                              const uint32_t* HWY_RESTRICT pairs, const float* HWY_RESTRICT rq4, int64_t D,
                              float* HWY_RESTRICT s4, float* HWY_RESTRICT m4, LinesAhead* HWY_RESTRICT ahead) {
#if ANCHORKV_AVX512_TARGET
  return QuadKeyResidualsBf16(codes, cb, slot0, zscale, res, nr, pairs, rq4, D, s4, m4, ahead);
#else
  (void)codes, (void)cb, (void)slot0, (void)zscale, (void)res, (void)nr, (void)pairs, (void)rq4, (void)D,
      (void)s4, (void)m4, (void)ahead;
  HWY_ASSERT(false);  // callers check SupportsBf16Residuals
#endif
}

void QuadValueResiduals2BitBf16(const uint8_t* HWY_RESTRICT codes, int64_t cb, int64_t slot0, int64_t nr,
                                const uint32_t* HWY_RESTRICT pairs, const float* HWY_RESTRICT p4,
                                const int32_t* HWY_RESTRICT res, const float* HWY_RESTRICT zscale, int64_t gn,
                                int64_t D, float* HWY_RESTRICT rot, LinesAhead* HWY_RESTRICT ahead) {
#if ANCHORKV_AVX512_TARGET
  return QuadValueResidualsBf16(codes, cb, slot0, nr, pairs, p4, res, zscale, gn, D, rot, ahead);
#else
  (void)codes, (void)cb, (void)slot0, (void)nr, (void)pairs, (void)p4, (void)res, (void)zscale, (void)gn,
      (void)D, (void)rot, (void)ahead;
  HWY_ASSERT(false);  // callers check SupportsBf16Residuals
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_RESIDUALS_INL_H_
