// Attention ops: the entry metadata of a compressed row decoded without
// positions (MetaOut): anchor ordinals and the entries that carry residuals.
// A per-target "-inl.h" header of kernels/attention_kernels.cc (the only
// file that includes it): its guard toggles once per Highway target.
#if defined(ANCHORKV_KERNELS_OPS_META_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_KERNELS_OPS_META_INL_H_
#undef ANCHORKV_KERNELS_OPS_META_INL_H_
#else
#define ANCHORKV_KERNELS_OPS_META_INL_H_
#endif

#include "hwy/highway.h"
#include "kernels/ops_reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

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

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_KERNELS_OPS_META_INL_H_
