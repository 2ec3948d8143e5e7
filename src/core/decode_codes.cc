// The residual and affine code decoders (declared in core/linalg.h): codes
// of 1 to 8 bits packed LSB first turned into their levels, SIMD through
// Highway with a scalar twin each.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/linalg.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/decode_codes.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// out[i] = levels[code i] for 2-bit codes packed 4 per byte, element i in bits
// 2 (i % 4) of byte i / 4: N codes become indices by one broadcast, per-lane
// shift and mask, then a lane permutation of the 4 levels.
void Decode2Bit(const uint8_t* HWY_RESTRICT codes, const float* HWY_RESTRICT levels, int64_t D,
                float* HWY_RESTRICT out) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (N >= 4 && N <= 16) {
    float table[16] = {levels[0], levels[1], levels[2], levels[3]};
    const auto lv = hn::LoadU(df, table);
    const auto shifts = hn::ShiftLeft<1>(hn::Iota(du, 0));
    const auto three = hn::Set(du, 3u);
    const size_t bytes = static_cast<size_t>(N / 4);
    for (; i + N <= D; i += N) {
      uint32_t w = 0;
      std::memcpy(&w, codes + i / 4, bytes);
      const auto idx = hn::BitCast(di, hn::And(hn::Shr(hn::Set(du, w), shifts), three));
      hn::StoreU(hn::TableLookupLanes(lv, hn::IndicesFromVec(df, idx)), df, out + i);
    }
  }
  for (; i < D; ++i) out[i] = levels[(codes[i / 4] >> ((i % 4) * 2)) & 3];
}

// out[i] = levels[code i] for b-bit codes (b in 1..4) packed LSB first: eight
// codes fill b bytes, so a vector of 8 or 16 lanes takes one or two b-byte
// words, shifts each lane by b * (i % 8) and masks, then permutes the 2^b
// levels (at most 16: one vector on 16 lanes; 8 lanes take b <= 3).
void DecodeCodes(const uint8_t* HWY_RESTRICT codes, int bits, const float* HWY_RESTRICT levels, int64_t n,
                 float* HWY_RESTRICT out) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const uint32_t mask = (1u << bits) - 1;
  int64_t i = 0;
  if ((N == 8 || N == 16) && (int64_t{1} << bits) <= N) {
    HWY_ALIGN float table[16] = {};
    for (uint32_t k = 0; k <= mask; ++k) table[k] = levels[k];
    const auto lv = hn::LoadU(df, table);
    const auto lane = hn::Iota(du, 0);
    const auto shifts = hn::Mul(hn::And(lane, hn::Set(du, 7u)), hn::Set(du, static_cast<uint32_t>(bits)));
    const auto upper = hn::RebindMask(du, hn::Gt(hn::BitCast(di, lane), hn::Set(di, 7)));
    const auto m = hn::Set(du, mask);
    // One 8-byte load per vector holds its 2 b bytes (while 8 bytes are left).
    const int64_t end = (n * bits + 7) / 8;
    const uint64_t word_mask = (uint64_t{1} << (8 * bits)) - 1;  // b bytes: eight codes
    for (; i + N <= n && i * bits / 8 + 8 <= end; i += N) {
      uint64_t x;
      std::memcpy(&x, codes + i * bits / 8, 8);
      const auto w0 = static_cast<uint32_t>(x & word_mask), w1 = static_cast<uint32_t>((x >> (8 * bits)) & word_mask);
      const auto w = hn::IfThenElse(upper, hn::Set(du, w1), hn::Set(du, w0));
      const auto idx = hn::BitCast(di, hn::And(hn::Shr(w, shifts), m));
      hn::StoreU(hn::TableLookupLanes(lv, hn::IndicesFromVec(df, idx)), df, out + i);
    }
  }
  for (; i < n; ++i) {
    const int64_t bit = i * bits;
    uint32_t v = codes[bit / 8] >> (bit % 8);
    if (bit % 8 + bits > 8) v |= static_cast<uint32_t>(codes[bit / 8 + 1]) << (8 - bit % 8);
    out[i] = levels[v & mask];
  }
}

// Affine codes of rows rebuilt (decode_affine): per row and channel group the
// 2^b levels zero + k * scale fill one table vector, then the codes are looked
// up as in DecodeCodes, reading exactly the bytes of each vector's codes so a
// group's last vector never reads past its row.
template <int kBits>
void DecodeAffineRows(const uint8_t* HWY_RESTRICT codes, const float* HWY_RESTRICT pairs, int64_t rows,
                      int64_t D, int64_t cg, float* HWY_RESTRICT out) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const bool lanes = kBits < 8 && (N == 8 || N == 16) && int64_t{kMask} < N;
  const int64_t row_bytes = D * kBits / 8, groups = (D + cg - 1) / cg;
  const auto lane = hn::Iota(du, 0);
  const auto shifts = hn::Mul(hn::And(lane, hn::Set(du, 7u)), hn::Set(du, static_cast<uint32_t>(kBits)));
  const auto upper = hn::RebindMask(du, hn::Gt(hn::BitCast(di, lane), hn::Set(di, 7)));
  constexpr int kWordBits = kBits < 8 ? 8 * kBits : 32;  // kBits bytes: eight codes (8-bit codes take no table)
  constexpr uint64_t word_mask = (uint64_t{1} << kWordBits) - 1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t grp = 0, off = 0; grp < groups; ++grp, off += cg) {
      const float scale = pairs[(r * groups + grp) * 2], zero = pairs[(r * groups + grp) * 2 + 1];
      const uint8_t* c = codes + r * row_bytes + off * kBits / 8;
      float* o = out + r * D + off;
      const int64_t n = std::min(cg, D - off);
      int64_t i = 0;
      if (lanes) {
        const auto lv = hn::MulAdd(hn::Iota(df, 0), hn::Set(df, scale), hn::Set(df, zero));
        for (; i + N <= n; i += N) {
          uint64_t x = 0;
          std::memcpy(&x, c + i * kBits / 8, std::min<size_t>(8, static_cast<size_t>(N * kBits / 8)));
          const auto w0 = static_cast<uint32_t>(x & word_mask), w1 = static_cast<uint32_t>((x >> kWordBits) & word_mask);
          const auto w = hn::IfThenElse(upper, hn::Set(du, w1), hn::Set(du, w0));
          const auto idx = hn::BitCast(di, hn::And(hn::Shr(w, shifts), hn::Set(du, kMask)));
          hn::StoreU(hn::TableLookupLanes(lv, hn::IndicesFromVec(df, idx)), df, o + i);
        }
      }
      for (; i < n; ++i) {
        const uint32_t v = (c[i * kBits / 8] >> (i * kBits % 8)) & kMask;
        o[i] = std::fma(static_cast<float>(v), scale, zero);
      }
    }
}

void DecodeAffine(const uint8_t* HWY_RESTRICT codes, int bits, const float* HWY_RESTRICT pairs, int64_t rows,
                  int64_t D, int64_t cg, float* HWY_RESTRICT out) {
  switch (bits) {
    case 1: return DecodeAffineRows<1>(codes, pairs, rows, D, cg, out);
    case 2: return DecodeAffineRows<2>(codes, pairs, rows, D, cg, out);
    case 4: return DecodeAffineRows<4>(codes, pairs, rows, D, cg, out);
    default: return DecodeAffineRows<8>(codes, pairs, rows, D, cg, out);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::core {

HWY_EXPORT(Decode2Bit);
HWY_EXPORT(DecodeCodes);
HWY_EXPORT(DecodeAffine);

void decode_codes_2bit(const uint8_t* codes, const float* levels, int64_t D, float* out) {
  HWY_DYNAMIC_DISPATCH(Decode2Bit)(codes, levels, D, out);
}

void decode_codes_2bit_ref(const uint8_t* codes, const float* levels, int64_t D, float* out) {
  for (int64_t i = 0; i < D; ++i) out[i] = levels[(codes[i / 4] >> ((i % 4) * 2)) & 3];
}

void decode_codes(const uint8_t* codes, int bits, const float* levels, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeCodes)(codes, bits, levels, n, out);
}

void decode_codes_ref(const uint8_t* codes, int bits, const float* levels, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (int b = 0; b < bits; ++b) {
      const int64_t bit = i * bits + b;
      v |= static_cast<uint32_t>((codes[bit / 8] >> (bit % 8)) & 1) << b;
    }
    out[i] = levels[v];
  }
}

void decode_affine(const uint8_t* codes, int bits, const float* pairs, int64_t rows, int64_t D, int64_t cg,
                   float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeAffine)(codes, bits, pairs, rows, D, std::min(cg, D), out);
}

void decode_affine_ref(const uint8_t* codes, int bits, const float* pairs, int64_t rows, int64_t D, int64_t cg,
                       float* out) {
  cg = std::min(cg, D);
  const int64_t groups = (D + cg - 1) / cg;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t bit = (r * D + d) * bits;
      const auto v = static_cast<uint32_t>((codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1));
      const float* p = pairs + (r * groups + d / cg) * 2;
      out[r * D + d] = std::fma(static_cast<float>(v), p[0], p[1]);
    }
}

}  // namespace anchorkv::core
#endif  // HWY_ONCE
