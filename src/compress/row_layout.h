// The three metadata layouts of a compressed row as types (docs/storage.md
// has the bytes; compress/segment.h the row that holds them). Each says which
// of the row's buffers it fills, how an entry's fields and coefficients are
// packed and read, what an entry, an anchor and a row cost, and how many
// anchors its ordinals can name. Code that must choose a layout does so once,
// with with_layout(layout, f), and f works with the type it is handed: the
// row's accessors, the encoder, the byte budget, the attention kernels'
// decoders. The types are templates over the row and side so that they come
// before them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "anchorkv/config.h"
#include "core/error.h"
#include "core/half.h"

namespace anchorkv::compress {

inline constexpr int kMetaFieldBits = 20;
inline constexpr int64_t kMaxAnchors = (int64_t{1} << kMetaFieldBits) - 1;
inline constexpr int64_t kMaxCompactAnchors = (int64_t{1} << 15) - 1;
inline constexpr int64_t kMaxTightAnchors = int64_t{1} << 8;

// One non-anchor token's metadata, whatever the layout: the anchor each side
// is approximated by, the anchors before it (derived where the layout lists
// positions), and whether each side has a residual.
struct Meta {
  int32_t anchor_k = 0;
  int32_t anchor_v = 0;
  int32_t anchors_before = 0;
  bool res_k = false;
  bool res_v = false;
};

inline uint64_t pack_meta(const Meta& m) {
  constexpr uint64_t mask = (uint64_t{1} << kMetaFieldBits) - 1;
  return (static_cast<uint64_t>(m.anchor_k) & mask) | ((static_cast<uint64_t>(m.anchor_v) & mask) << 20) |
         ((static_cast<uint64_t>(m.anchors_before) & mask) << 40) | (static_cast<uint64_t>(m.res_k) << 60) |
         (static_cast<uint64_t>(m.res_v) << 61);
}
inline Meta unpack_meta(uint64_t w) {
  constexpr uint64_t mask = (uint64_t{1} << kMetaFieldBits) - 1;
  Meta m;
  m.anchor_k = static_cast<int32_t>(w & mask);
  m.anchor_v = static_cast<int32_t>((w >> 20) & mask);
  m.anchors_before = static_cast<int32_t>((w >> 40) & mask);
  m.res_k = ((w >> 60) & 1) != 0;
  m.res_v = ((w >> 61) & 1) != 0;
  return m;
}

// Compact layout: anchors_before is not stored (see EntryMetaReader).
inline uint32_t pack_meta32(const Meta& m) {
  return (static_cast<uint32_t>(m.anchor_k) & 0x7FFF) | (static_cast<uint32_t>(m.res_k) << 15) |
         ((static_cast<uint32_t>(m.anchor_v) & 0x7FFF) << 16) | (static_cast<uint32_t>(m.res_v) << 31);
}
inline Meta unpack_meta32(uint32_t w) {
  Meta m;
  m.anchor_k = static_cast<int32_t>(w & 0x7FFF);
  m.res_k = ((w >> 15) & 1) != 0;
  m.anchor_v = static_cast<int32_t>((w >> 16) & 0x7FFF);
  m.res_v = ((w >> 31) & 1) != 0;
  return m;
}
// Tight layout: 8-bit anchor ordinals in meta16, the residual flags in bit 6
// of each side's coefficient byte.
inline constexpr uint8_t kTightResidual = 0x40;
inline uint16_t pack_meta16(const Meta& m) {
  return static_cast<uint16_t>((static_cast<uint32_t>(m.anchor_k) & 0xFF) |
                               ((static_cast<uint32_t>(m.anchor_v) & 0xFF) << 8));
}
inline Meta unpack_meta16(uint16_t w, uint8_t coef_k, uint8_t coef_v) {
  Meta m;
  m.anchor_k = w & 0xFF;
  m.anchor_v = (w >> 8) & 0xFF;
  m.res_k = (coef_k & kTightResidual) != 0;
  m.res_v = (coef_v & kTightResidual) != 0;
  return m;
}

// Tight coefficients (see the layout above; codes carry no residual flag
// here). The exponent that puts the largest magnitude at the top code, the
// code of a gamma, and the values the codes stand for (the flag bit is
// ignored); encoder and decoder use the same function, so a decoded gamma is
// bit for bit the one the residuals were taken against.
int8_t tight_coef_exp(float max_abs);
uint8_t tight_coef_code(float gamma, int coef_exp);
float tight_coef(uint8_t code, int coef_exp);
void tight_coef_table(int coef_exp, float table[256]);

// Seed layout: per non-anchor token a uint64 word (both sides' 20-bit anchor
// ordinals, the anchors before it, the residual flags) and an fp32
// coefficient per side.
struct SeedLayout {
  static constexpr MetadataLayout kKind = MetadataLayout::kSeed;
  static constexpr bool kListsPositions = false;  // anchors_before rides in each word
  static constexpr int64_t kMaxAnchors = compress::kMaxAnchors;
  // Bytes per non-anchor token (both sides), per anchor beside its fp16 K and
  // V rows, and per row and side.
  static constexpr int64_t kEntryBytes = 2 * (4 + 4), kAnchorBytes = 0, kSideBytes = 0;
  template <class Row>
  static auto& words(Row& r) { return r.meta; }
  template <class Side>
  static auto& coefs(Side& s) { return s.coef; }
  template <class Row>
  static Meta fields(const Row& r, int64_t e) { return unpack_meta(r.meta[e]); }
  template <class Row>
  static bool res_k(const Row& r, int64_t e) { return ((r.meta[e] >> 60) & 1) != 0; }
  template <class Row>
  static bool res_v(const Row& r, int64_t e) { return ((r.meta[e] >> 61) & 1) != 0; }
  template <class Side>
  static float coef(const Side& s, int64_t e) { return s.coef[e]; }
  template <class Row>
  static void begin(Row&, float /*max_abs_gamma_k*/, float /*max_abs_gamma_v*/) {}
  template <class Row>
  static void append_fields(Row& r, const Meta& m) { r.meta.push_back(pack_meta(m)); }
  // Appends a coefficient; returns it as stored (what the residual is taken against).
  template <class Side>
  static float append_coef(Side& s, float g, bool /*residual*/) {
    s.coef.push_back(g);
    return g;
  }
};

// Compact layout: a uint32 word (15-bit ordinals and the flags) and an fp16
// coefficient per side; the anchors' positions listed (int32 each).
struct CompactLayout {
  static constexpr MetadataLayout kKind = MetadataLayout::kCompact;
  static constexpr bool kListsPositions = true;
  static constexpr int64_t kMaxAnchors = kMaxCompactAnchors;
  static constexpr int64_t kEntryBytes = 2 * (2 + 2), kAnchorBytes = 4, kSideBytes = 0;
  template <class Row>
  static auto& words(Row& r) { return r.meta32; }
  template <class Side>
  static auto& coefs(Side& s) { return s.coef16; }
  template <class Row>
  static Meta fields(const Row& r, int64_t e) { return unpack_meta32(r.meta32[e]); }
  template <class Row>
  static bool res_k(const Row& r, int64_t e) { return ((r.meta32[e] >> 15) & 1) != 0; }
  template <class Row>
  static bool res_v(const Row& r, int64_t e) { return ((r.meta32[e] >> 31) & 1) != 0; }
  template <class Side>
  static float coef(const Side& s, int64_t e) { return core::half_to_float(s.coef16[e]); }
  template <class Row>
  static void begin(Row&, float, float) {}
  template <class Row>
  static void append_fields(Row& r, const Meta& m) { r.meta32.push_back(pack_meta32(m)); }
  template <class Side>
  static float append_coef(Side& s, float g, bool /*residual*/) {
    const uint16_t h = core::float_to_half(std::clamp(g, -core::kFp16Max, core::kFp16Max));
    s.coef16.push_back(h);
    return core::half_to_float(h);
  }
};

// Tight layout: a uint16 word (8-bit ordinals) and a coefficient byte per side
// (sign, the side's residual flag, a log-scale magnitude against the side's
// exponent, one int8 per row); the anchors' positions listed.
struct TightLayout {
  static constexpr MetadataLayout kKind = MetadataLayout::kTight;
  static constexpr bool kListsPositions = true;
  static constexpr int64_t kMaxAnchors = kMaxTightAnchors;
  static constexpr int64_t kEntryBytes = 2 + 1 + 1, kAnchorBytes = 4, kSideBytes = 1;
  template <class Row>
  static auto& words(Row& r) { return r.meta16; }
  template <class Side>
  static auto& coefs(Side& s) { return s.coef8; }
  template <class Row>
  static Meta fields(const Row& r, int64_t e) { return unpack_meta16(r.meta16[e], r.k.coef8[e], r.v.coef8[e]); }
  template <class Row>
  static bool res_k(const Row& r, int64_t e) { return (r.k.coef8[e] & kTightResidual) != 0; }
  template <class Row>
  static bool res_v(const Row& r, int64_t e) { return (r.v.coef8[e] & kTightResidual) != 0; }
  template <class Side>
  static float coef(const Side& s, int64_t e) { return tight_coef(s.coef8[e], s.coef_exp); }
  // Each side's exponent puts its largest |gamma| at the top code.
  template <class Row>
  static void begin(Row& r, float max_abs_gamma_k, float max_abs_gamma_v) {
    r.k.coef_exp = tight_coef_exp(max_abs_gamma_k);
    r.v.coef_exp = tight_coef_exp(max_abs_gamma_v);
  }
  template <class Row>
  static void append_fields(Row& r, const Meta& m) { r.meta16.push_back(pack_meta16(m)); }
  template <class Side>
  static float append_coef(Side& s, float g, bool residual) {  // the residual flag rides in the byte
    const uint8_t code = tight_coef_code(g, s.coef_exp);
    s.coef8.push_back(static_cast<uint8_t>(code | (residual ? kTightResidual : 0)));
    return tight_coef(code, s.coef_exp);
  }
};

// f(SeedLayout{}), f(CompactLayout{}) or f(TightLayout{}) for `layout`. The
// switch names every layout (no default: -Wswitch names a missing case);
// a value outside the enum never gets here (configs are validated, and a
// cache file's layout byte is checked against its config's before any row).
template <class F>
decltype(auto) with_layout(MetadataLayout layout, F&& f) {
  switch (layout) {
    case MetadataLayout::kSeed:
      return f(SeedLayout{});
    case MetadataLayout::kCompact:
      return f(CompactLayout{});
    case MetadataLayout::kTight:
      return f(TightLayout{});
  }
  core::fail(ErrorCode::kInvalidConfig, "anchorkv::compress::with_layout",
             "metadata layout " + std::to_string(static_cast<int>(layout)) + " is not one of the layouts");
}

// The most anchors a segment row may hold in a layout (a row whose every
// token is an anchor needs no metadata and may hold more).
inline int64_t max_anchors(MetadataLayout layout) {
  return with_layout(layout, [](auto L) { return L.kMaxAnchors; });
}

}  // namespace anchorkv::compress
