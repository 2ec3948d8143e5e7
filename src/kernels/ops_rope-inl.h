// Attention ops: pre-RoPE anchor scores for a quad of queries, the queries
// rotated once per block of positions and the fp16 anchors read in place.
// A per-target "-inl.h" header of kernels/quad_entries.cc (the only file
// that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_ROPE_INL_H_
#undef ANCHORKV_KERNELS_OPS_ROPE_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_ROPE_INL_H_
#endif

#include "hwy/highway.h"
#include "kernels/ops_quad-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Pre-RoPE keys: the quad's split queries Q [4, D] rotated back to the start
// p0 of each kRopeStep-block of positions, Qb [nb, 4, D] for blocks b0 ..
// b0 + nb - 1 (rows b of the block starts' table, RopeTable::step_cos /
// step_sin): q . RoPE_{p0 + j}(k) = RoPE_{-p0}(q) . RoPE_j(k), so a key at
// position p needs only the near row of j = p mod kRopeStep (RopeTable::
// near_cos / near_sin, cache-resident) and no angle of its own.
void RopeQueryBlocks(const float* HWY_RESTRICT Q, int64_t D, int64_t b0, int64_t nb,
                     const float* HWY_RESTRICT step_cos, const float* HWY_RESTRICT step_sin,
                     float* HWY_RESTRICT Qb) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), half = D / 2;
  for (int64_t b = 0; b < nb; ++b) {
    const float *c = step_cos + (b0 + b) * half, *sn = step_sin + (b0 + b) * half;
    for (int64_t g = 0; g < 4; ++g) {
      const float* q = Q + g * D;
      float* out = Qb + (b * 4 + g) * D;
      for (int64_t t = 0; t + N <= half; t += N) {
        hn::Vec<DF> rx, ry;  // by -p0: the sines negated
        RotatePairs(hn::LoadU(df, q + t), hn::LoadU(df, q + half + t), hn::LoadU(df, c + t),
                    hn::Neg(hn::LoadU(df, sn + t)), rx, ry);
        hn::StoreU(rx, df, out + t);
        hn::StoreU(ry, df, out + half + t);
      }
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// A vector of floats from f32, or from fp16 bits (exact either way).
HWY_INLINE hn::Vec<DF> LoadAsF32(const float* HWY_RESTRICT p) { return hn::LoadU(DF(), p); }
HWY_INLINE hn::Vec<DF> LoadAsF32(const uint16_t* HWY_RESTRICT p) {
#if ANCHORKV_HW_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(DF(), hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
  for (size_t i = 0; i < hn::Lanes(DF()); ++i) lanes[i] = core::half_to_float(p[i]);
  return hn::Load(DF(), lanes);
#endif
}

// [q_g . RoPE_j(x)] for the four split rows of Q [4, D]: x split (f32 or
// fp16 bits), rotated by the angles cj / sj (D/2 each).
template <class T>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> RopeDots4(const T* HWY_RESTRICT x, const float* HWY_RESTRICT Q,
                                                      const float* HWY_RESTRICT cj,
                                                      const float* HWY_RESTRICT sj, int64_t D) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), half = D / 2;
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  for (int64_t t = 0; t < half; t += N) {
    hn::Vec<DF> rx, ry;
    RotatePairs(LoadAsF32(x + t), LoadAsF32(x + half + t), hn::LoadU(df, cj + t), hn::LoadU(df, sj + t), rx,
                ry);
    a0 = hn::MulAdd(hn::LoadU(df, Q + half + t), ry, hn::MulAdd(hn::LoadU(df, Q + t), rx, a0));
    a1 = hn::MulAdd(hn::LoadU(df, Q + D + half + t), ry, hn::MulAdd(hn::LoadU(df, Q + D + t), rx, a1));
    a2 =
        hn::MulAdd(hn::LoadU(df, Q + 2 * D + half + t), ry, hn::MulAdd(hn::LoadU(df, Q + 2 * D + t), rx, a2));
    a3 =
        hn::MulAdd(hn::LoadU(df, Q + 3 * D + half + t), ry, hn::MulAdd(hn::LoadU(df, Q + 3 * D + t), rx, a3));
  }
  return SumsOf4(a0, a1, a2, a3);
}

#if ANCHORKV_AVX512_TARGET
// Entries i .. i + 3 of a block's run: each one's anchor row, near angles
// and fused key residual (fk.zero when it has none).
struct FourEntries {
  const uint16_t* a[4];
  const float *cj[4], *sj[4], *z[4];
  bool fused = false;  // some of the four has a fused residual
};

template <int64_t kD>
HWY_INLINE FourEntries FourEntriesAt(const uint16_t* HWY_RESTRICT A, const int32_t* HWY_RESTRICT ak,
                                     const int64_t* HWY_RESTRICT pos, int64_t offset,
                                     const float* HWY_RESTRICT cos_t, const float* HWY_RESTRICT sin_t,
                                     const FusedKeys& fk, int64_t i, int64_t n) {
  constexpr int64_t half = kD / 2;
  FourEntries f;
  for (int e = 0; e < 4; ++e) {
    const int64_t j = (pos[i + e] + offset) % kRopeStep;
    f.a[e] = A + ak[i + e] * kD;
    f.cj[e] = cos_t + j * half;
    f.sj[e] = sin_t + j * half;
    const int32_t r = fk.zi ? fk.zi[i + e] : -1;
    f.z[e] = r >= 0 ? fk.Z + r * kD : fk.zero;
    f.fused |= r >= 0;
  }
  // anchors sit in L2 in no order the prefetchers see: each is requested
  // two groups ahead (~5% of the pre-RoPE decode)
  if (i + 12 <= n)
    for (int e = 8; e < 12; ++e)
      for (int64_t b = 0; b < kD * 2; b += 64) hwy::Prefetch(reinterpret_cast<const char*>(A + ak[i + e] * kD) + b);
  return f;
}

// Entry e's key (anchor plus fused residual) at pairs t .. t + 15, rotated
// to its offset in the block.
template <int64_t kD, bool kResiduals>
HWY_INLINE void RotatedKey(const FourEntries& f, int e, int64_t t, hn::Vec<DF>& rx, hn::Vec<DF>& ry) {
  const DF df;
  constexpr int64_t half = kD / 2;
  auto x = LoadAsF32(f.a[e] + t), y = LoadAsF32(f.a[e] + half + t);
  if constexpr (kResiduals) {
    x = hn::Add(x, hn::LoadU(df, f.z[e] + t));
    y = hn::Add(y, hn::LoadU(df, f.z[e] + half + t));
  }
  RotatePairs(x, y, hn::LoadU(df, f.cj[e] + t), hn::LoadU(df, f.sj[e] + t), rx, ry);
}
#endif

// s4[i * 4 + g] = gk[i] * q_g . RoPE_{p_i}(a_{ak[i]} + z_i) with p_i = pos[i] +
// offset, entries of one block whose queries Q [4, D] are rotated back to its
// start (RopeQueryBlocks): each entry's anchor (A [k, D], split rows,
// core::rope_split) plus its fused key residual (FusedKeys: z_i = Z[zi[i]]
// when zi[i] >= 0, else none) is rotated by the near row of j = p_i mod
// kRopeStep, then dotted with the queries. A rotation is two multiplies and
// two multiply-adds per 16 pairs; the anchor's D fp16 values are read per
// entry (the pair-product form, four queries' worth, was 8x the bytes from
// L2; f32 rows twice them).
template <int64_t kD>  // 0: D at run time
HWY_INLINE void QuadRopeBlockScores(const uint16_t* HWY_RESTRICT A, const float* HWY_RESTRICT Q, int64_t D,
                                    const int32_t* HWY_RESTRICT ak, const float* HWY_RESTRICT gk,
                                    const int64_t* HWY_RESTRICT pos, int64_t offset,
                                    const float* HWY_RESTRICT cos_t, const float* HWY_RESTRICT sin_t,
                                    const FusedKeys& fk, int64_t n, float* HWY_RESTRICT s4) {
  if constexpr (kD != 0) D = kD;
  const hn::CappedTag<float, 4> d4;
  const int64_t half = D / 2;
  int64_t i = 0;
#if ANCHORKV_AVX512_TARGET
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  // Four entries at once: the queries loaded once for the four, their 16
  // sums in one pass (one at a time, the horizontal sums took about a
  // quarter of the kernel's samples).
  if constexpr (kD != 0) {
    for (; i + 4 <= n; i += 4) {
      const FourEntries f = FourEntriesAt<kD>(A, ak, pos, offset, cos_t, sin_t, fk, i, n);
      hn::Vec<DF> acc[16];
      for (auto& x : acc) x = hn::Zero(df);
      // groups without a residual skip the additions (a branch per group,
      // not per vector)
      const auto group = [&](auto with_residuals) {
        for (int64_t t = 0; t < half; t += N) {
#pragma GCC unroll 4
          for (int e = 0; e < 4; ++e) {
            hn::Vec<DF> rx, ry;  // the key's pairs at the entry's offset in the block
            RotatedKey<kD, decltype(with_residuals)::value>(f, e, t, rx, ry);
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g)
              acc[e * 4 + g] = hn::MulAdd(hn::LoadU(df, Q + g * kD + half + t), ry,
                                          hn::MulAdd(hn::LoadU(df, Q + g * kD + t), rx, acc[e * 4 + g]));
          }
        }
      };
      if (f.fused)
        group(std::true_type());
      else
        group(std::false_type());
      hn::StoreU(hn::Mul(SumsOf16(acc), SpreadFour(gk + i)), df, s4 + i * 4);
    }
  }
#endif
  for (; i < n; ++i) {
    const int64_t j = (pos[i] + offset) % kRopeStep;
    auto dots = RopeDots4(A + ak[i] * D, Q, cos_t + j * half, sin_t + j * half, D);
    if (fk.zi && fk.zi[i] >= 0)
      dots = hn::Add(dots, RopeDots4(fk.Z + fk.zi[i] * D, Q, cos_t + j * half, sin_t + j * half, D));
    hn::StoreU(hn::Mul(dots, hn::Set(d4, gk[i])), d4, s4 + i * 4);
  }
}
#endif

#if ANCHORKV_AVX512_TARGET
// QuadRopeBlockScores with bf16 products (AttentionOptions::bf16_scores):
// each entry's rotated key and the block's queries rounded to bf16, two
// products per lane and instruction (VDPBF16PS), sums in fp32. The rotation
// stays fp32. Lanes pair the same coordinates in both operands, so the
// order _mm512_cvtne2ps_pbh leaves them in needs no shuffle. Entries past
// the last whole four take the fp32 path.
template <int64_t kD>
ANCHORKV_BF16_ATTR void QuadRopeBlockScoresBf16(const uint16_t* HWY_RESTRICT A, const float* HWY_RESTRICT Q,
                                                const int32_t* HWY_RESTRICT ak, const float* HWY_RESTRICT gk,
                                                const int64_t* HWY_RESTRICT pos, int64_t offset,
                                                const float* HWY_RESTRICT cos_t, const float* HWY_RESTRICT sin_t,
                                                const FusedKeys& fk, int64_t n, float* HWY_RESTRICT s4) {
  const DF df;
  constexpr int64_t half = kD / 2, NC = half / 16;
  __m512bh qb[4 * NC];  // (q_x, q_y) of query g, pairs 16c .. 16c + 15
  for (int64_t g = 0; g < 4; ++g)
    for (int64_t c = 0; c < NC; ++c)
      qb[g * NC + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(Q + g * kD + half + 16 * c),
                                           _mm512_loadu_ps(Q + g * kD + 16 * c));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const FourEntries f = FourEntriesAt<kD>(A, ak, pos, offset, cos_t, sin_t, fk, i, n);
    hn::Vec<DF> acc[16];
    for (auto& x : acc) x = hn::Zero(df);
    const auto group = [&](auto with_residuals) ANCHORKV_BF16_ATTR {  // clang: a lambda takes the pragma's target, not its function's
      for (int64_t c = 0; c < NC; ++c) {
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          hn::Vec<DF> rx, ry;
          RotatedKey<kD, decltype(with_residuals)::value>(f, e, 16 * c, rx, ry);
          const __m512bh k = _mm512_cvtne2ps_pbh(ry.raw, rx.raw);
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) acc[e * 4 + g].raw = _mm512_dpbf16_ps(acc[e * 4 + g].raw, k, qb[g * NC + c]);
        }
      }
    };
    if (f.fused)
      group(std::true_type());
    else
      group(std::false_type());
    hn::StoreU(hn::Mul(SumsOf16(acc), SpreadFour(gk + i)), df, s4 + i * 4);
  }
  if (i < n) {
    const FusedKeys rest{fk.zi ? fk.zi + i : nullptr, fk.Z, fk.zero};
    QuadRopeBlockScores<kD>(A, Q, kD, ak + i, gk + i, pos + i, offset, cos_t, sin_t, rest, n - i, s4 + i * 4);
  }
}
#endif

// The same over entries of any blocks (Qb from RopeQueryBlocks, first block
// b0): runs of entries in one block each; bf16: QuadRopeBlockScoresBf16
// where the CPU has it (the caller checks SupportsBf16Scores).
void QuadRopeScores(const uint16_t* HWY_RESTRICT A, const float* HWY_RESTRICT Qb, int64_t b0, int64_t D,
                    const int32_t* HWY_RESTRICT ak, const float* HWY_RESTRICT gk,
                    const int64_t* HWY_RESTRICT pos, int64_t offset, const float* HWY_RESTRICT cos_t,
                    const float* HWY_RESTRICT sin_t, const FusedKeys* HWY_RESTRICT fk, int64_t n, bool bf16,
                    float* HWY_RESTRICT s4) {
#if HWY_TARGET == HWY_SCALAR
  (void)A, (void)Qb, (void)b0, (void)D, (void)ak, (void)gk, (void)pos, (void)offset, (void)cos_t, (void)sin_t,
      (void)fk, (void)n, (void)bf16, (void)s4;
#else
  for (int64_t i = 0, e; i < n; i = e) {
    const int64_t block = (pos[i] + offset) / kRopeStep;
    for (e = i + 1; e < n && (pos[e] + offset) / kRopeStep == block;) ++e;
    const float* Q = Qb + (block - b0) * 4 * D;
    const FusedKeys run_keys{fk->zi ? fk->zi + i : nullptr, fk->Z, fk->zero};
    const auto run = [&](auto kD) {
#if ANCHORKV_AVX512_TARGET
      if constexpr (decltype(kD)::value != 0)
        if (bf16)
          return QuadRopeBlockScoresBf16<decltype(kD)::value>(A, Q, ak + i, gk + i, pos + i, offset, cos_t,
                                                              sin_t, run_keys, e - i, s4 + i * 4);
#else
      (void)bf16;  // SupportsBf16Scores is false on this target
#endif
      QuadRopeBlockScores<decltype(kD)::value>(A, Q, D, ak + i, gk + i, pos + i, offset, cos_t, sin_t,
                                               run_keys, e - i, s4 + i * 4);
    };
    if (D == 128)
      run(std::integral_constant<int64_t, 128>());
    else if (D == 64)
      run(std::integral_constant<int64_t, 64>());
    else
      run(std::integral_constant<int64_t, 0>());
  }
#endif
}

// Pre-RoPE key residuals not fused into their anchor scores (gamma = 0):
// s4[res[j] * 4 + g] += zscale[j] * q_g . RoPE_{p}(z_j), p = pos[res[j]] +
// offset, z_j the split residual keys Z [nr, D] (SplitKeys2Bit or the general
// decode), q_g the block's rotated queries (Qb); m4[g] raised to the largest
// score so changed.
void QuadRopeKeyResiduals(const float* HWY_RESTRICT Z, const float* HWY_RESTRICT zscale,
                          const int32_t* HWY_RESTRICT res, int64_t nr, const float* HWY_RESTRICT Qb,
                          int64_t b0, int64_t D, const int64_t* HWY_RESTRICT pos, int64_t offset,
                          const float* HWY_RESTRICT cos_t, const float* HWY_RESTRICT sin_t,
                          float* HWY_RESTRICT s4, float* HWY_RESTRICT m4) {
#if HWY_TARGET == HWY_SCALAR
  (void)Z, (void)zscale, (void)res, (void)nr, (void)Qb, (void)b0, (void)D, (void)pos, (void)offset,
      (void)cos_t, (void)sin_t, (void)s4, (void)m4;
#else
  const hn::CappedTag<float, 4> d4;
  const int64_t half = D / 2;
  auto mx = hn::LoadU(d4, m4);
  for (int64_t j = 0; j < nr; ++j) {
    const int64_t p = pos[res[j]] + offset, jj = p % kRopeStep;
    const float* Q = Qb + (p / kRopeStep - b0) * 4 * D;
    const auto dots = RopeDots4(Z + j * D, Q, cos_t + jj * half, sin_t + jj * half, D);
    float* s = s4 + res[j] * 4;
    const auto v = hn::MulAdd(dots, hn::Set(d4, zscale[j]), hn::LoadU(d4, s));
    hn::StoreU(v, d4, s);
    mx = hn::Max(mx, v);
  }
  hn::StoreU(mx, d4, m4);
#endif
}

bool SupportsQuadRope(int64_t D) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return HWY_TARGET != HWY_SCALAR && N >= 4 && (D / 2) % N == 0;
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_ROPE_INL_H_
