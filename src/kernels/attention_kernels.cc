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

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_kernels.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "core/simd-inl.h"
// clang-format on

// Defined once, not per target (this file is compiled once per SIMD target).
#ifndef ANCHORKV_KERNELS_META_OUT_
#define ANCHORKV_KERNELS_META_OUT_
namespace anchorkv::kernels {
// Room past a residual list's last entry: DecodeMeta* store whole vectors.
constexpr int64_t kListSlack = 64;

// Decoded entry metadata without positions: anchor ordinals per entry and the
// (chunk-local) indices of entries that carry a K / V residual.
struct MetaOut {
  int32_t* ak;
  int32_t* av;
  int32_t* res_k;
  int32_t* res_v;
  int64_t nk = 0, nv = 0;
};

// Byte ranges of the cache to request into L2 while a loop computes: the
// next sub-tile's streams, whose lines would otherwise arrive only when its
// passes read them (the hardware prefetchers did not run that far ahead).
// The requests are spread over the sub-tile's passes (exps, key and value
// residuals): all in the exp loop, they stalled it once the line fill
// buffers were full (perf: ~11% of its samples on the prefetches, from
// memory) while the residual passes left the memory idle.
struct LinesAhead {
  static constexpr int kMax = 6;
  const char* at[kMax];
  int64_t left[kMax];  // bytes of the range from `at` on
  int n = 0, i = 0;
  void add(const void* p, int64_t bytes) {
    if (bytes <= 0 || n == kMax) return;
    at[n] = static_cast<const char*>(p);
    left[n++] = bytes;
  }
  // One line of the current range (none once all are requested).
  void request_one() {
    if (i == n) return;
    __builtin_prefetch(at[i], 0, 2);
    if (left[i] > 64) {
      at[i] += 64, left[i] -= 64;
    } else {
      ++i;
    }
  }
};

// Pre-RoPE key residuals coded as given, fused into their entries' anchor
// scores (QuadRopeScores): entry i's key is gamma_i (a + Z[zi[i]]) when
// zi[i] >= 0, the row scaled by scale / gamma_i. zi null: none; zero: D
// zeros (what an entry without one adds in a group that has some).
struct FusedKeys {
  const int32_t* zi = nullptr;
  const float* Z = nullptr;
  const float* zero = nullptr;
};
}  // namespace anchorkv::kernels
#endif

// The targets with 16-lane vectors and the AVX-512 intrinsics SumsOf16 uses
// (evaluated per target: this file is compiled once for each).
#ifndef ANCHORKV_AVX512_TARGET
#define ANCHORKV_AVX512_TARGET (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#endif

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
using core::HWY_NAMESPACE::ExpNonPositive;
using core::HWY_NAMESPACE::HadamardWithin;
using core::HWY_NAMESPACE::RotatePairs;

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
    const auto v = hn::IfThenElse(mask, core::HWY_NAMESPACE::LoadTail(d, x + i, n - i), hn::Set(d, -HUGE_VALF));
    const auto e = hn::Exp(d, hn::Sub(v, vm));
    hn::BlendedStore(e, mask, d, x + i);
    sum = hn::Add(sum, hn::IfThenElseZero(mask, e));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// out[i] = scale[i] * table[idx[i]]: the anchor scores of n tokens (vector gathers).
void GatherScaled(const float* HWY_RESTRICT table, const int32_t* HWY_RESTRICT idx,
                  const float* HWY_RESTRICT scale, int64_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, scale + i), hn::GatherIndex(df, table, hn::LoadU(di, idx + i))), df,
               out + i);
  for (; i < n; ++i) out[i] = scale[i] * table[idx[i]];
}

// Per-anchor value weights across the query group: W[idx[i] * 4 + g] += P[i * 4 + g]
// for a group of 4 queries, one 4-lane add per token. Tokens alternate between two
// accumulators, so neighbours that share an anchor do not wait on each other.
void ScatterAdd4(const float* HWY_RESTRICT P, const int32_t* HWY_RESTRICT idx, int64_t n,
                 float* HWY_RESTRICT W0, float* HWY_RESTRICT W1) {
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

// ---- Entry metadata without positions (MetaOut).

// The seed and compact layouts' bit fields (compress/segment.h; the tight
// layout has its own decoder below).
struct SeedMeta {  // anchor K in bits 0..19, anchor V in 20..39, residual flags at 60 / 61
  using Word = uint64_t;
  static constexpr int kVShift = 20;
  static constexpr Word kField = (Word{1} << 20) - 1, kFlagK = Word{1} << 60, kFlagV = Word{1} << 61;
  static compress::Meta unpack(Word w) { return compress::unpack_meta(w); }
};
struct CompactMeta {  // anchor K in bits 0..14, K residual 15, anchor V 16..30, V residual 31
  using Word = uint32_t;
  static constexpr int kVShift = 16;
  static constexpr Word kField = 0x7FFF, kFlagK = Word{1} << 15, kFlagV = Word{1} << 31;
  static compress::Meta unpack(Word w) { return compress::unpack_meta32(w); }
};

// Appends the lanes of idx where `flagged` is set to list[count..]: the
// compressed vector is stored whole (kListSlack past the list's end). A
// compress straight to memory is microcoded on AMD Zen 4/5, ~30% of this
// decode's samples there.
template <class D, class M>
HWY_INLINE void AppendFlagged(D d, hn::Vec<D> idx, M flagged, int32_t* HWY_RESTRICT list, int64_t& count) {
  hn::StoreU(hn::Compress(idx, flagged), d, list + count);
  count += static_cast<int64_t>(hn::CountTrue(d, flagged));
}

// Per step, the entries of one 32-bit vector: their ordinals widened or cut
// to 32 bits, and the indices of the flagged ones compressed into the
// residual lists (vpcompressd on AVX-512; a loop over the set bits had cost
// a mispredicted branch every few entries).
template <class Layout>
HWY_INLINE void DecodeMetaWords(const typename Layout::Word* HWY_RESTRICT w, int64_t n, MetaOut* out) {
  using Word = typename Layout::Word;
  const hn::ScalableTag<int32_t> d32;
  const hn::Repartition<Word, decltype(d32)> dw;
  const hn::Rebind<uint32_t, decltype(dw)> dn;  // a word vector's lanes as 32 bits
  const int64_t N32 = static_cast<int64_t>(hn::Lanes(d32)), NW = static_cast<int64_t>(hn::Lanes(dw));
  constexpr int kWordsPerStep = sizeof(Word) / 4;
  const auto field = hn::Set(dw, Layout::kField);
  const auto flag_k = hn::Set(dw, Layout::kFlagK), flag_v = hn::Set(dw, Layout::kFlagV);
  auto to32 = [&](auto v) {
    if constexpr (sizeof(Word) == 8) {
      return hn::TruncateTo(dn, v);
    } else {
      return v;
    }
  };
  const auto iota = hn::Iota(d32, 0);
  int64_t i = 0;
  if (N32 <= 64 && NW * kWordsPerStep == N32) {  // (one-lane targets: the scalar loop)
    for (; i + N32 <= n; i += N32) {
      uint64_t mk = 0, mv = 0;
      for (int h = 0; h < kWordsPerStep; ++h) {
        const int64_t e = i + h * NW;
        const auto v = hn::LoadU(dw, w + e);
        hn::StoreU(to32(hn::And(v, field)), dn, reinterpret_cast<uint32_t*>(out->ak + e));
        hn::StoreU(to32(hn::And(hn::ShiftRight<Layout::kVShift>(v), field)), dn,
                   reinterpret_cast<uint32_t*>(out->av + e));
        uint8_t bits[8] = {};
        uint64_t b = 0;
        hn::StoreMaskBits(dw, hn::TestBit(v, flag_k), bits);
        std::memcpy(&b, bits, 8);
        mk |= b << (h * NW);
        hn::StoreMaskBits(dw, hn::TestBit(v, flag_v), bits);
        std::memcpy(&b, bits, 8);
        mv |= b << (h * NW);
      }
      uint8_t bytes[8];
      const auto idx = hn::Add(iota, hn::Set(d32, static_cast<int32_t>(i)));
      std::memcpy(bytes, &mk, 8);
      AppendFlagged(d32, idx, hn::LoadMaskBits(d32, bytes), out->res_k, out->nk);
      std::memcpy(bytes, &mv, 8);
      AppendFlagged(d32, idx, hn::LoadMaskBits(d32, bytes), out->res_v, out->nv);
    }
  }
  for (; i < n; ++i) {
    const compress::Meta m = Layout::unpack(w[i]);
    out->ak[i] = m.anchor_k, out->av[i] = m.anchor_v;
    if (m.res_k) out->res_k[out->nk++] = static_cast<int32_t>(i);
    if (m.res_v) out->res_v[out->nv++] = static_cast<int32_t>(i);
  }
}

void DecodeMetaSeed(const uint64_t* HWY_RESTRICT w, int64_t n, MetaOut* out) {
  DecodeMetaWords<SeedMeta>(w, n, out);
}
void DecodeMetaCompact(const uint32_t* HWY_RESTRICT w, int64_t n, MetaOut* out) {
  DecodeMetaWords<CompactMeta>(w, n, out);
}
// Tight: 8-bit ordinals in the u16 words, residual flags in bit 6 of each
// side's coefficient byte; all widened to 32-bit lanes.
void DecodeMetaTight(const uint16_t* HWY_RESTRICT w, const uint8_t* HWY_RESTRICT ck, const uint8_t* HWY_RESTRICT cv,
                     int64_t n, MetaOut* out) {
  const hn::ScalableTag<int32_t> d32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const hn::Rebind<uint8_t, decltype(d32)> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d32));
  const auto field = hn::Set(d32, 0xFF), flag = hn::Set(d32, int32_t{compress::kTightResidual});
  const auto iota = hn::Iota(d32, 0);
  int64_t i = 0;
  for (; i + N <= n; i += N) {  // as DecodeMetaWords: flagged indices compressed into the lists
    const auto v = hn::BitCast(d32, hn::PromoteTo(hn::RebindToUnsigned<decltype(d32)>(), hn::LoadU(d16, w + i)));
    hn::StoreU(hn::And(v, field), d32, out->ak + i);
    hn::StoreU(hn::ShiftRight<8>(v), d32, out->av + i);
    const auto idx = hn::Add(iota, hn::Set(d32, static_cast<int32_t>(i)));
    const auto fk = hn::TestBit(hn::BitCast(d32, hn::PromoteTo(hn::RebindToUnsigned<decltype(d32)>(), hn::LoadU(d8, ck + i))), flag);
    const auto fv = hn::TestBit(hn::BitCast(d32, hn::PromoteTo(hn::RebindToUnsigned<decltype(d32)>(), hn::LoadU(d8, cv + i))), flag);
    AppendFlagged(d32, idx, fk, out->res_k, out->nk);
    AppendFlagged(d32, idx, fv, out->res_v, out->nv);
  }
  for (; i < n; ++i) {
    const compress::Meta m = compress::unpack_meta16(w[i], ck[i], cv[i]);
    out->ak[i] = m.anchor_k, out->av[i] = m.anchor_v;
    if (m.res_k) out->res_k[out->nk++] = static_cast<int32_t>(i);
    if (m.res_v) out->res_v[out->nv++] = static_cast<int32_t>(i);
  }
}

// ---- Query quads: four queries of one KV row, stored token-major (s4[i * 4 + g]),
// so one 4-lane vector carries an entry's scores for the whole quad.

#if HWY_TARGET != HWY_SCALAR
// A vector folded to one 128-bit block of partial sums.
template <class D>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> FoldToBlock(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return FoldToBlock(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}

// [sum(a0), sum(a1), sum(a2), sum(a3)] in one 4-lane vector (needs N >= 4).
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> SumsOf4(hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2,
                                                    hn::Vec<DF> a3) {
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const auto b0 = FoldToBlock(df, a0), b1 = FoldToBlock(df, a1), b2 = FoldToBlock(df, a2),
             b3 = FoldToBlock(df, a3);
  // [b0_0 + b0_2, b1_0 + b1_2, b0_1 + b0_3, b1_1 + b1_3] and the same for b2, b3
  const auto u01 = hn::Add(hn::InterleaveLower(d4, b0, b1), hn::InterleaveUpper(d4, b0, b1));
  const auto u23 = hn::Add(hn::InterleaveLower(d4, b2, b3), hn::InterleaveUpper(d4, b2, b3));
  return hn::Add(hn::ConcatLowerLower(d4, u23, u01), hn::ConcatUpperUpper(d4, u23, u01));
}
#endif

// s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g]: the anchor approximation's scores
// from the quad's interleaved anchor-dot table T [k, 4].
void QuadAnchorScores(const float* HWY_RESTRICT T, const int32_t* HWY_RESTRICT ak,
                      const float* HWY_RESTRICT gk, int64_t n, float* HWY_RESTRICT s4) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g];
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    hn::StoreU(hn::Mul(hn::Set(d4, gk[i]), hn::LoadU(d4, T + ak[i] * 4)), d4, s4 + i * 4);
}

#if ANCHORKV_AVX512_TARGET
// The sums of 16 vectors of 16 lanes, in order, in one vector: [sum(a[0]), ..., sum(a[15])].
// Pairs of lanes, then of 64-bit halves, are added within each 128-bit block
// (each block then holds four sources' partial sums), then blocks are paired
// across vectors: 45 shuffles and adds for 16 sums, against 22 per 4 in SumsOf4.
HWY_INLINE hn::Vec<DF> SumsOf16(const hn::Vec<DF>* a) {
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  hn::Vec<DF> w[4];
  for (int m = 0; m < 4; ++m) {
    const auto* x = a + 4 * m;
    const auto u01 = hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
    const auto u23 = hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
    const auto lo = hn::InterleaveLower(d64, hn::BitCast(d64, u01), hn::BitCast(d64, u23));
    const auto hi = hn::InterleaveUpper(d64, hn::BitCast(d64, u01), hn::BitCast(d64, u23));
    w[m] = hn::Add(hn::BitCast(df, lo), hn::BitCast(df, hi));  // block b: four sources' partial sums
  }
  // Blocks 0, 2 of x and y plus their blocks 1, 3: half as many blocks per source.
  auto pair_blocks = [](hn::Vec<DF> x, hn::Vec<DF> y) {
    return hn::Vec<DF>{_mm512_add_ps(_mm512_shuffle_f32x4(x.raw, y.raw, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(x.raw, y.raw, _MM_SHUFFLE(3, 1, 3, 1)))};
  };
  return pair_blocks(pair_blocks(w[0], w[1]), pair_blocks(w[2], w[3]));
}

// [x[0] x 4, x[1] x 4, x[2] x 4, x[3] x 4]: four per-entry factors over an entry's four lanes.
HWY_INLINE hn::Vec<DF> SpreadFour(const float* HWY_RESTRICT x) {
  const DF df;
  alignas(64) static constexpr int32_t kSpread[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const auto x4 = hn::LoadU(hn::CappedTag<float, 4>(), x);
  return hn::TableLookupLanes(hn::ZeroExtendVector(df, hn::ZeroExtendVector(hn::Half<DF>(), x4)),
                              hn::SetTableIndices(df, kSpread));
}
#endif

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
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), half = D / 2;
  int64_t i = 0;
#if ANCHORKV_AVX512_TARGET
  // Four entries at once: the queries loaded once for the four, their 16
  // sums in one pass (one at a time, the horizontal sums took about a
  // quarter of the kernel's samples).
  if constexpr (kD != 0) {
    for (; i + 4 <= n; i += 4) {
      const uint16_t* a[4];
      const float *cj[4], *sj[4], *z[4];
      bool fused = false;
      for (int e = 0; e < 4; ++e) {
        const int64_t j = (pos[i + e] + offset) % kRopeStep;
        a[e] = A + ak[i + e] * kD;
        cj[e] = cos_t + j * half;
        sj[e] = sin_t + j * half;
        const int32_t r = fk.zi ? fk.zi[i + e] : -1;
        z[e] = r >= 0 ? fk.Z + r * kD : fk.zero;
        fused |= r >= 0;
      }
      // anchors sit in L2 in no order the prefetchers see: each is requested
      // two groups ahead (~5% of the pre-RoPE decode)
      if (i + 12 <= n)
        for (int e = 8; e < 12; ++e)
          for (int64_t b = 0; b < kD * 2; b += 64)
            hwy::Prefetch(reinterpret_cast<const char*>(A + ak[i + e] * kD) + b);
      hn::Vec<DF> acc[16];
      for (auto& x : acc) x = hn::Zero(df);
      // groups without a residual skip the additions (a branch per group,
      // not per vector)
      const auto group = [&](auto with_residuals) {
        for (int64_t t = 0; t < half; t += N) {
#pragma GCC unroll 4
          for (int e = 0; e < 4; ++e) {
            auto x = LoadAsF32(a[e] + t), y = LoadAsF32(a[e] + half + t);
            if constexpr (decltype(with_residuals)::value) {
              x = hn::Add(x, hn::LoadU(df, z[e] + t));
              y = hn::Add(y, hn::LoadU(df, z[e] + half + t));
            }
            hn::Vec<DF> rx, ry;  // the key's pairs at the entry's offset in the block
            RotatePairs(x, y, hn::LoadU(df, cj[e] + t), hn::LoadU(df, sj[e] + t), rx, ry);
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g)
              acc[e * 4 + g] = hn::MulAdd(hn::LoadU(df, Q + g * kD + half + t), ry,
                                          hn::MulAdd(hn::LoadU(df, Q + g * kD + t), rx, acc[e * 4 + g]));
          }
        }
      };
      if (fused)
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

// The same over entries of any blocks (Qb from RopeQueryBlocks, first block
// b0): runs of entries in one block each.
void QuadRopeScores(const uint16_t* HWY_RESTRICT A, const float* HWY_RESTRICT Qb, int64_t b0, int64_t D,
                    const int32_t* HWY_RESTRICT ak, const float* HWY_RESTRICT gk,
                    const int64_t* HWY_RESTRICT pos, int64_t offset, const float* HWY_RESTRICT cos_t,
                    const float* HWY_RESTRICT sin_t, const FusedKeys* HWY_RESTRICT fk, int64_t n,
                    float* HWY_RESTRICT s4) {
#if HWY_TARGET == HWY_SCALAR
  (void)A, (void)Qb, (void)b0, (void)D, (void)ak, (void)gk, (void)pos, (void)offset, (void)cos_t, (void)sin_t,
      (void)fk, (void)n, (void)s4;
#else
  for (int64_t i = 0, e; i < n; i = e) {
    const int64_t block = (pos[i] + offset) / kRopeStep;
    for (e = i + 1; e < n && (pos[e] + offset) / kRopeStep == block;) ++e;
    const float* Q = Qb + (block - b0) * 4 * D;
    const FusedKeys run_keys{fk->zi ? fk->zi + i : nullptr, fk->Z, fk->zero};
    const auto run = [&](auto kD) {
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

// Per query g: m4[g] = max_i s4[i * 4 + g].
void QuadMax(const float* HWY_RESTRICT s4, int64_t n, float* HWY_RESTRICT m4) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), total = 4 * n;
  for (int g = 0; g < 4; ++g) m4[g] = -HUGE_VALF;
  int64_t j = 0;
  if (N % 4 == 0) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    // four running maxima: one would wait on its own latency every vector
    auto m0 = hn::Set(d, -HUGE_VALF), m1 = m0, m2 = m0, m3 = m0;
    for (; j + 4 * N <= total; j += 4 * N) {
      m0 = hn::Max(m0, hn::LoadU(d, s4 + j));
      m1 = hn::Max(m1, hn::LoadU(d, s4 + j + N));
      m2 = hn::Max(m2, hn::LoadU(d, s4 + j + 2 * N));
      m3 = hn::Max(m3, hn::LoadU(d, s4 + j + 3 * N));
    }
    for (; j + N <= total; j += N) m0 = hn::Max(m0, hn::LoadU(d, s4 + j));
    hn::Store(hn::Max(hn::Max(m0, m1), hn::Max(m2, m3)), d, lanes);
    for (int64_t t = 0; t < N; ++t) m4[t % 4] = std::max(m4[t % 4], lanes[t]);
  }
  for (; j < total; ++j) m4[j % 4] = std::max(m4[j % 4], s4[j]);
}

// The anchor scores (QuadAnchorScores) and their maxima per query (QuadMax).
// AVX-512: four entries per vector, their table rows inserted as blocks, the
// maxima taken on the way (no second pass over the scores).
void QuadAnchorScoresMax(const float* HWY_RESTRICT T, const int32_t* HWY_RESTRICT ak,
                         const float* HWY_RESTRICT gk, int64_t n, float* HWY_RESTRICT s4, float* HWY_RESTRICT m4) {
#if ANCHORKV_AVX512_TARGET
  auto four = [&](int64_t e) {
    __m512 t = _mm512_castps128_ps512(_mm_loadu_ps(T + int64_t{ak[e]} * 4));  // 64-bit: see QuadExpScatter
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 1]} * 4), 1);
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 2]} * 4), 2);
    t = _mm512_insertf32x4(t, _mm_loadu_ps(T + int64_t{ak[e + 3]} * 4), 3);
    const __m512 v = _mm512_mul_ps(t, SpreadFour(gk + e).raw);
    _mm512_storeu_ps(s4 + e * 4, v);
    return v;
  };
  __m512 mx0 = _mm512_set1_ps(-HUGE_VALF), mx1 = mx0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    mx0 = _mm512_max_ps(mx0, four(i));
    mx1 = _mm512_max_ps(mx1, four(i + 4));
  }
  for (; i + 4 <= n; i += 4) mx0 = _mm512_max_ps(mx0, four(i));
  const __m512 m = _mm512_max_ps(mx0, mx1);  // lane l holds query l % 4
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
  _mm_storeu_ps(m4, _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  for (; i < n; ++i)
    for (int g = 0; g < 4; ++g) m4[g] = std::max(m4[g], s4[i * 4 + g] = gk[i] * T[ak[i] * 4 + g]);
#else
  QuadAnchorScores(T, ak, gk, n, s4);
  QuadMax(s4, n, m4);
#endif
}

// W[av[i] * 4 + g] += p4[i * 4 + g] * gv[i]: value weights per anchor, one
// 4-lane add per entry. Even entries go to W0, odd ones to W1, so neighbours
// that share an anchor do not wait on each other through memory.
void QuadScatter(const float* HWY_RESTRICT p4, const int32_t* HWY_RESTRICT av, const float* HWY_RESTRICT gv,
                 int64_t n, float* HWY_RESTRICT W0, float* HWY_RESTRICT W1) {
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) != 4) {
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < 4; ++g) (i % 2 ? W1 : W0)[av[i] * 4 + g] += p4[i * 4 + g] * gv[i];
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    float* a = W0 + av[i] * 4;
    float* b = W1 + av[i + 1] * 4;
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4), hn::Set(d4, gv[i]), hn::LoadU(d4, a)), d4, a);
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4 + 4), hn::Set(d4, gv[i + 1]), hn::LoadU(d4, b)), d4, b);
  }
  if (i < n) {
    float* a = W0 + av[i] * 4;
    hn::StoreU(hn::MulAdd(hn::LoadU(d4, p4 + i * 4), hn::Set(d4, gv[i]), hn::LoadU(d4, a)), d4, a);
  }
}

// The softmax's exps and the value weights in one pass: s4 = exp(s4 - m4)
// (scores finite, at most kHeadroom above m4), l4[g] = sum of query g's, and
// QuadScatter's W0 / W1. AVX-512: four entries per vector; the exps keep the
// vector units busy while the scatter's read-modify-writes wait on memory,
// and one line of `ahead` is requested per four entries.
void QuadExpScatter(float* HWY_RESTRICT s4, int64_t n, const float* HWY_RESTRICT m4, float* HWY_RESTRICT l4,
                    const int32_t* HWY_RESTRICT av, const float* HWY_RESTRICT gv, float* HWY_RESTRICT W0,
                    float* HWY_RESTRICT W1, LinesAhead* HWY_RESTRICT ahead) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int g = 0; g < 4; ++g) l4[g] = 0;
  int64_t i = 0;
#if ANCHORKV_AVX512_TARGET
  const auto vm = hn::Vec<DF>{_mm512_broadcast_f32x4(_mm_loadu_ps(m4))};
  auto vsum = hn::Zero(d);
  for (; i + 4 <= n; i += 4) {
    ahead->request_one();
    const auto e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s4 + i * 4), vm));
    hn::StoreU(e, d, s4 + i * 4);
    vsum = hn::Add(vsum, e);
    const __m512 pv = _mm512_mul_ps(e.raw, SpreadFour(gv + i).raw);
    // 64-bit offsets: an int32 ordinal scaled in 32 bits cost a sign extension per entry
    float *w0 = W0 + int64_t{av[i]} * 4, *w1 = W1 + int64_t{av[i + 1]} * 4;
    _mm_storeu_ps(w0, _mm_add_ps(_mm_loadu_ps(w0), _mm512_castps512_ps128(pv)));
    _mm_storeu_ps(w1, _mm_add_ps(_mm_loadu_ps(w1), _mm512_extractf32x4_ps(pv, 1)));
    float *w2 = W0 + int64_t{av[i + 2]} * 4, *w3 = W1 + int64_t{av[i + 3]} * 4;
    _mm_storeu_ps(w2, _mm_add_ps(_mm_loadu_ps(w2), _mm512_extractf32x4_ps(pv, 2)));
    _mm_storeu_ps(w3, _mm_add_ps(_mm_loadu_ps(w3), _mm512_extractf32x4_ps(pv, 3)));
  }
  HWY_ALIGN float lanes[16];
  hn::Store(vsum, d, lanes);
  for (int64_t t = 0; t < 16; ++t) l4[t % 4] += lanes[t];
  for (; i < n; ++i)
    for (int g = 0; g < 4; ++g) {
      const float p = s4[i * 4 + g] = std::exp(s4[i * 4 + g] - m4[g]);
      l4[g] += p;
      (i % 2 ? W1 : W0)[av[i] * 4 + g] += p * gv[i];
    }
  (void)N;
#else
  const int64_t total = 4 * n;
  int64_t j = 0;
  if (N % 4 == 0) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    for (int64_t t = 0; t < N; ++t) lanes[t] = m4[t % 4];
    const auto vm = hn::Load(d, lanes);
    auto vsum = hn::Zero(d);
    for (; j + N <= total; j += N) {
      const auto e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s4 + j), vm));
      hn::StoreU(e, d, s4 + j);
      vsum = hn::Add(vsum, e);
    }
    hn::Store(vsum, d, lanes);
    for (int64_t t = 0; t < N; ++t) l4[t % 4] += lanes[t];
  }
  for (; j < total; ++j) l4[j % 4] += (s4[j] = std::exp(s4[j] - m4[j % 4]));
  QuadScatter(s4, av, gv, n, W0, W1);
  (void)i, (void)ahead;
#endif
}

// A quad's anchor weights back to one row per query: w[g * k + j] =
// W0[j * 4 + g] + W1[j * 4 + g] for g < gn.
void SumQuadWeights(const float* HWY_RESTRICT W0, const float* HWY_RESTRICT W1, int64_t k, int64_t gn,
                    float* HWY_RESTRICT w) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= k; j += N) {
    hn::Vec<DF> a[4], b[4];
    hn::LoadInterleaved4(d, W0 + j * 4, a[0], a[1], a[2], a[3]);
    hn::LoadInterleaved4(d, W1 + j * 4, b[0], b[1], b[2], b[3]);
    for (int64_t g = 0; g < gn; ++g) hn::StoreU(hn::Add(a[g], b[g]), d, w + g * k + j);
  }
  for (; j < k; ++j)
    for (int64_t g = 0; g < gn; ++g) w[g * k + j] = W0[j * 4 + g] + W1[j * 4 + g];
}

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
    lv = hn::Load(df, table);
    shifts = hn::ShiftLeft<1>(hn::Iota(du, 0));
  }
  HWY_INLINE hn::Vec<DF> at(const uint8_t* HWY_RESTRICT codes, int64_t d) const {
    uint32_t w = 0;
    std::memcpy(&w, codes + d / 4, hn::Lanes(df) / 4);
#if ANCHORKV_AVX512_TARGET
    return hn::Vec<DF>{_mm512_permutexvar_ps(hn::Shr(hn::Set(du, w), shifts).raw, lv.raw)};
#else
    const auto idx = hn::BitCast(di, hn::And(hn::Shr(hn::Set(du, w), shifts), hn::Set(du, 3u)));
    return hn::TableLookupLanes(lv, hn::IndicesFromVec(df, idx));
#endif
  }
  DF df;
  hn::RebindToUnsigned<DF> du;
  hn::RebindToSigned<DF> di;
  hn::Vec<DF> lv;
  hn::Vec<hn::RebindToUnsigned<DF>> shifts;
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
    if (row_scale) dec.lv = hn::Mul(dec.lv, hn::Set(df, row_scale[j]));
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
        v[u] = hn::Vec<DF>{_mm512_permutexvar_ps(_mm512_srlv_epi32(words, shift_x), dec.lv.raw)};
        v[u + kV / 2] = hn::Vec<DF>{_mm512_permutexvar_ps(_mm512_srlv_epi32(words, shift_y), dec.lv.raw)};
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
        hn::Vec<DF> a[QP][PB];
        for (int q = 0; q < QP; ++q)
          for (int b = 0; b < PB; ++b)
            a[q][b] = q < qn ? hn::LoadU(df, rot + (g0 + q) * D + (b0 + b) * N) : hn::Zero(df);
        for (int64_t j = 0; j < jn; ++j) {
          const uint8_t* c = codes + (slot0 + j0 + j) * cb;
          if ((j & 1) == 0) ahead->request_one();  // one line per two residuals and block
          hn::Vec<DF> x[QP];
          for (int q = 0; q < QP; ++q) x[q] = hn::Set(df, xs[j * 4 + (g0 + q) % 4]);  // zero past gn
          for (int b = 0; b < PB; ++b) {
            const auto z = dec.at(c, (b0 + b) * N);
            for (int q = 0; q < QP; ++q) a[q][b] = hn::MulAdd(x[q], z, a[q][b]);
          }
        }
        for (int q = 0; q < qn; ++q)
          for (int b = 0; b < PB; ++b) hn::StoreU(a[q][b], df, rot + (g0 + q) * D + (b0 + b) * N);
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

// ---- fp16 anchors used in place (no f32 copy per call).

bool SupportsF16Rows(int64_t D) {
#if ANCHORKV_HW_F16
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return D % N == 0 && D / N <= 8;
#else
  (void)D;
  return false;
#endif
}

#if ANCHORKV_HW_F16
// out[g, j] = q[g] . A[j] for queries [g0, g1) and rows [j0, j1), one row at a time.
HWY_INLINE void DotRowsF16Range(const float* HWY_RESTRICT q, int64_t g0, int64_t g1, const hwy::float16_t* a16,
                                int64_t j0, int64_t j1, int64_t k, int64_t D, float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t g = g0; g < g1; g += 4) {
      const int64_t gn = g1 - g < 4 ? g1 - g : 4;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (int64_t d = 0; d < D; d += N) {
        const auto a = hn::PromoteTo(df, hn::LoadU(dh, a16 + j * D + d));
        a0 = hn::MulAdd(hn::LoadU(df, q + g * D + d), a, a0);
        if (gn > 1) a1 = hn::MulAdd(hn::LoadU(df, q + (g + 1) * D + d), a, a1);
        if (gn > 2) a2 = hn::MulAdd(hn::LoadU(df, q + (g + 2) * D + d), a, a2);
        if (gn > 3) a3 = hn::MulAdd(hn::LoadU(df, q + (g + 3) * D + d), a, a3);
      }
      out[g * k + j] = hn::GetLane(hn::SumOfLanes(df, a0));
      if (gn > 1) out[(g + 1) * k + j] = hn::GetLane(hn::SumOfLanes(df, a1));
      if (gn > 2) out[(g + 2) * k + j] = hn::GetLane(hn::SumOfLanes(df, a2));
      if (gn > 3) out[(g + 3) * k + j] = hn::GetLane(hn::SumOfLanes(df, a3));
    }
  }
}
#endif

// out[g, j] = q[g] . A[j] for fp16 rows A [k, D] (SupportsF16Rows(D)).
void DotRowsF16(const float* HWY_RESTRICT q, int64_t nq, const uint16_t* HWY_RESTRICT A16, int64_t k,
                int64_t D, float* HWY_RESTRICT out) {
#if ANCHORKV_HW_F16
  const auto* a16 = reinterpret_cast<const hwy::float16_t*>(A16);
  int64_t g0 = 0, j4 = 0;
#if ANCHORKV_AVX512_TARGET
  // Four rows by four queries at a time, their 16 sums in one SumsOf16 (a
  // reduction per row and query was most of the work).
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  j4 = k / 4 * 4;
  for (; g0 + 4 <= nq; g0 += 4) {
    const float* qg = q + g0 * D;
    for (int64_t j = 0; j < j4; j += 4) {
      if (j + 20 <= k)  // the four rows 16 on (from memory in a decode step)
        for (int64_t b = 0; b < 4 * D * 2; b += 64) __builtin_prefetch(a16 + (j + 16) * D + b / 2);
      hn::Vec<DF> acc[16];
      for (auto& a : acc) a = hn::Zero(df);
      for (int64_t d = 0; d < D; d += N) {
        const auto q0 = hn::LoadU(df, qg + d), q1 = hn::LoadU(df, qg + D + d);
        const auto q2 = hn::LoadU(df, qg + 2 * D + d), q3 = hn::LoadU(df, qg + 3 * D + d);
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          const auto a = hn::PromoteTo(df, hn::LoadU(dh, a16 + (j + e) * D + d));
          acc[e * 4] = hn::MulAdd(q0, a, acc[e * 4]);
          acc[e * 4 + 1] = hn::MulAdd(q1, a, acc[e * 4 + 1]);
          acc[e * 4 + 2] = hn::MulAdd(q2, a, acc[e * 4 + 2]);
          acc[e * 4 + 3] = hn::MulAdd(q3, a, acc[e * 4 + 3]);
        }
      }
      alignas(64) float sums[16];  // [row e][query g]
      hn::Store(SumsOf16(acc), df, sums);
      for (int e = 0; e < 4; ++e)
        for (int g = 0; g < 4; ++g) out[(g0 + g) * k + j + e] = sums[e * 4 + g];
    }
  }
#endif
  DotRowsF16Range(q, 0, g0, a16, j4, k, k, D, out);   // the rows past the last group of four
  DotRowsF16Range(q, g0, nq, a16, 0, k, k, D, out);   // the queries past the last quad
#else
  (void)q, (void)nq, (void)A16, (void)k, (void)D, (void)out;
#endif
}

#if ANCHORKV_HW_F16
// Y[g] += sum_j W[g * ldw + j] * A[j, d0 : d0 + NB * N] for four queries:
// each converted row segment serves all four.
template <int NB>
HWY_INLINE void AccumulateRowsF16Quad(const float* const* HWY_RESTRICT w, int64_t k,
                                      const hwy::float16_t* HWY_RESTRICT a16, int64_t D, int64_t d0,
                                      float* const* HWY_RESTRICT y) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[4][NB];
  for (int g = 0; g < 4; ++g)
    for (int b = 0; b < NB; ++b) acc[g][b] = hn::LoadU(df, y[g] + d0 + b * N);
  for (int64_t j = 0; j < k; ++j) {
    hn::Vec<DF> a[NB];
    if (j + 16 < k)  // the strip 16 rows on (its lines come from memory in a decode step)
      for (int64_t b = 0; b < NB * N * 2; b += 64) __builtin_prefetch(a16 + (j + 16) * D + d0 + b / 2);
    for (int b = 0; b < NB; ++b) a[b] = hn::PromoteTo(df, hn::LoadU(dh, a16 + j * D + d0 + b * N));
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const auto wg = hn::Set(df, w[g][j]);
      for (int b = 0; b < NB; ++b) acc[g][b] = hn::MulAdd(wg, a[b], acc[g][b]);
    }
  }
  for (int g = 0; g < 4; ++g)
    for (int b = 0; b < NB; ++b) hn::StoreU(acc[g][b], df, y[g] + d0 + b * N);
}
#endif

// Y[g * ldy + :D] += sum_j W[g * ldw + j] * A[j] for g < nq, fp16 rows A
// [k, D] (SupportsF16Rows(D)): quads of queries read each row once, in
// strips of up to four vectors (16 accumulators).
void AccumulateRowsF16Queries(const float* HWY_RESTRICT W, int64_t ldw, int64_t nq, int64_t k,
                              const uint16_t* HWY_RESTRICT A16, int64_t D, float* HWY_RESTRICT Y, int64_t ldy) {
#if ANCHORKV_HW_F16
  const auto* a16 = reinterpret_cast<const hwy::float16_t*>(A16);
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  thread_local std::vector<float> zero_w, spare_y;  // the lanes of a partial quad
  if (nq % 4 != 0) {
    zero_w.assign(static_cast<size_t>(k), 0.0f);
    spare_y.resize(static_cast<size_t>(D));
  }
  for (int64_t g0 = 0; g0 < nq; g0 += 4) {
    const float* w[4];
    float* y[4];
    for (int64_t g = 0; g < 4; ++g) {
      const bool real = g0 + g < nq;
      w[g] = real ? W + (g0 + g) * ldw : zero_w.data();
      y[g] = real ? Y + (g0 + g) * ldy : spare_y.data();
    }
    for (int64_t d0 = 0; d0 < D; d0 += 4 * N) {
      switch ((D - d0) / N) {
        case 1:
          AccumulateRowsF16Quad<1>(w, k, a16, D, d0, y);
          break;
        case 2:
          AccumulateRowsF16Quad<2>(w, k, a16, D, d0, y);
          break;
        case 3:
          AccumulateRowsF16Quad<3>(w, k, a16, D, d0, y);
          break;
        default:
          AccumulateRowsF16Quad<4>(w, k, a16, D, d0, y);
      }
    }
  }
#else
  (void)W, (void)ldw, (void)nq, (void)k, (void)A16, (void)D, (void)Y, (void)ldy;
#endif
}

float MaxOf(const float* HWY_RESTRICT x, int64_t n) { return core::HWY_NAMESPACE::MaxSpan(DF(), x, n); }

#if ANCHORKV_HW_F16
// acc[g, :] = sum_i p[g, i] * V[i, :] for D = NB vectors, two queries at a time.
template <int NB>
HWY_INLINE void ValuesTwoQueries(const float* HWY_RESTRICT s, int64_t nq, int64_t n, const uint16_t* V16,
                                 float* HWY_RESTRICT acc) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), D = NB * N;
  const auto* v16 = reinterpret_cast<const hwy::float16_t*>(V16);
  for (int64_t g0 = 0; g0 < nq; g0 += 2) {
    const float* p0 = s + g0 * n;
    const float* p1 = g0 + 1 < nq ? p0 + n : p0;
    hn::Vec<DF> a0[NB], a1[NB];
    for (int b = 0; b < NB; ++b) a0[b] = a1[b] = hn::Zero(df);
    for (int64_t i = 0; i < n; ++i) {
      hwy::Prefetch(v16 + (i + 8) * D);
      const auto w0 = hn::Set(df, p0[i]), w1 = hn::Set(df, p1[i]);
      for (int b = 0; b < NB; ++b) {
        const auto v = hn::PromoteTo(df, hn::LoadU(dh, v16 + i * D + b * N));
        a0[b] = hn::MulAdd(w0, v, a0[b]);
        a1[b] = hn::MulAdd(w1, v, a1[b]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      hn::StoreU(a0[b], df, acc + g0 * D + b * N);
      if (g0 + 1 < nq) hn::StoreU(a1[b], df, acc + (g0 + 1) * D + b * N);
    }
  }
}
#endif

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
    float tk[256], tv[256];
    compress::tight_coef_table(row.k.coef_exp, tk);
    compress::tight_coef_table(row.v.coef_exp, tv);
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
  if (!r.masked && (cq.rope == nullptr || !row.lists_positions())) {
    MetaOut mo{sc.ak.data(), sc.av.data(), sc.res_k.data(), sc.res_v.data()};
    if (row.tight())
      HWY_DYNAMIC_DISPATCH(DecodeMetaTight)(&row.meta16[static_cast<size_t>(r.e0)], &row.k.coef8[static_cast<size_t>(r.e0)],
                                            &row.v.coef8[static_cast<size_t>(r.e0)], n, &mo);
    else if (row.lists_positions())
      HWY_DYNAMIC_DISPATCH(DecodeMetaCompact)(&row.meta32[static_cast<size_t>(r.e0)], n, &mo);
    else
      HWY_DYNAMIC_DISPATCH(DecodeMetaSeed)(&row.meta[static_cast<size_t>(r.e0)], n, &mo);
    nk = mo.nk, nv = mo.nv;
    if (cq.rope) {
      const uint64_t* w = &row.meta[static_cast<size_t>(r.e0)];
      const int64_t p0 = r.seg_pos0 + r.e0;
      for (int64_t i = 0; i < n; ++i) sc.pos[i] = p0 + i + compress::unpack_meta(w[i]).anchors_before;
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
  Ops::value_weights(sc.s.data(), sc.gv_at, sc.av.data(), nq, n, k, out.w, sc);
  add_value_residuals<Ops>(row, codec, r, nq, out, sc);
  sc.slots_k = static_cast<int64_t>(sc.res_k.size());
  sc.slots_v = static_cast<int64_t>(sc.res_v.size());
}

// Scales of residual slots [slot0, slot0 + nr) of one side.
void residual_scales(const compress::CompressedSide& side, int64_t slot0, int64_t nr,
                     std::vector<float>& out) {
  out.resize(static_cast<size_t>(nr));
  if (nr > 0) core::f16_to_f32_n(side.scales.data() + slot0, out.data(), nr);
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
  const bool fused_v = codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(SupportsQuadValueResiduals)(D);
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
    residual_scales(row.k, sub.slot_k0, nrk, sc.zks);
    residual_scales(row.v, sub.slot_v0, nrv, sc.zvs);
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
