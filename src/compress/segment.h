// The compressed form of one (batch, head) row of a prefill segment, and its
// reconstruction (docs/spec.md §4.6, paper Eq. 3). Storage is exactly the seed's
// accounting (docs/spec.md §5), byte for byte (docs/storage.md):
//   anchor_k, anchor_v  [n_anchor, D] fp16           n_anchor * D * 4 bytes
//   meta                [n_other] uint64             8 bytes per non-anchor token:
//       bits  0..19  anchor ordinal for K
//       bits 20..39  anchor ordinal for V
//       bits 40..59  anchors before this token (so anchor positions need no list)
//       bit  60      token has a K residual;  bit 61: has a V residual
//   k.coef, v.coef      [n_other] fp32              8 bytes per non-anchor token
//   k.codes, v.codes    [n_res, ceil(D*bits/8)]     packed residual codes
//   k.scales, v.scales  [n_res] fp16                one scale per residual
// Non-anchor tokens appear in position order; the i-th flagged token of a
// side owns residual slot i of that side.
//
// Compact layout (MetadataLayout::kCompact): instead of meta + fp32 coefs,
//   meta32              [n_other] uint32: anchor K (bits 0..14), K residual (15),
//                       anchor V (16..30), V residual (31)
//   k.coef16, v.coef16  [n_other] fp16 gamma
//   anchor_pos          [n_anchor] int32 positions (anchors_before is derived)
// = 8 bytes per non-anchor token + 4 per anchor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress/codec.h"

namespace anchorkv::compress {

inline constexpr int kMetaFieldBits = 20;
inline constexpr int64_t kMaxAnchors = (int64_t{1} << kMetaFieldBits) - 1;
inline constexpr int64_t kMaxCompactAnchors = (int64_t{1} << 15) - 1;

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
inline bool meta_res_k(uint64_t w) { return ((w >> 60) & 1) != 0; }
inline bool meta_res_v(uint64_t w) { return ((w >> 61) & 1) != 0; }
inline bool meta32_res_k(uint32_t w) { return ((w >> 15) & 1) != 0; }
inline bool meta32_res_v(uint32_t w) { return ((w >> 31) & 1) != 0; }

struct CompressedSide {
  std::vector<float> coef;      // [n_other] (seed layout)
  std::vector<uint16_t> coef16; // [n_other] fp16 (compact layout)
  std::vector<uint8_t> codes;   // [n_res, code_bytes]
  std::vector<uint16_t> scales; // [n_res] fp16
  int64_t n_residual() const { return static_cast<int64_t>(scales.size()); }
};

struct CompressedRow {
  int64_t length = 0;    // S, token positions in the segment
  int64_t n_anchor = 0;
  bool compact = false;
  std::vector<uint16_t> anchor_k;  // [n_anchor, D] fp16
  std::vector<uint16_t> anchor_v;  // [n_anchor, D] fp16
  std::vector<uint64_t> meta;      // [n_other] (seed layout)
  std::vector<uint32_t> meta32;    // [n_other] (compact layout)
  std::vector<int32_t> anchor_pos; // [n_anchor] (compact layout)
  CompressedSide k, v;

  int64_t n_other() const { return static_cast<int64_t>(compact ? meta32.size() : meta.size()); }
  // Entry e's metadata in either layout (compact: anchors_before by binary search).
  Meta meta_at(int64_t e) const;
  bool res_k(int64_t e) const { return compact ? meta32_res_k(meta32[e]) : meta_res_k(meta[e]); }
  bool res_v(int64_t e) const { return compact ? meta32_res_v(meta32[e]) : meta_res_v(meta[e]); }
  float coef_k(int64_t e) const;
  float coef_v(int64_t e) const;
  int64_t n_residual() const { return k.n_residual() + v.n_residual(); }
  // Sum of the sizes of the buffers above (what is really held).
  int64_t buffer_bytes() const;
  // Anchor positions, ascending, recovered from the metadata.
  std::vector<int32_t> anchor_positions() const;
};

// Reads the metadata of entries e0, e0 + 1, ... of a row in either layout.
// With `need_before`, compact rows find anchors_before by one binary search,
// then step it (amortised O(1) per entry); otherwise it is left 0 for them.
class EntryMetaReader {
 public:
  EntryMetaReader(const CompressedRow& row, int64_t e0, bool need_before)
      : row_(row), e_(e0), need_before_(need_before),
        before_(row.compact && need_before ? row.meta_at(e0).anchors_before : 0) {}
  Meta next() {
    const int64_t e = e_++;
    if (!row_.compact) return unpack_meta(row_.meta[e]);
    Meta m = unpack_meta32(row_.meta32[e]);
    if (need_before_) {
      // Anchor j has anchor_pos[j] - j entries before it.
      while (before_ < row_.n_anchor && row_.anchor_pos[before_] - before_ <= e) ++before_;
      m.anchors_before = static_cast<int32_t>(before_);
    }
    return m;
  }

 private:
  const CompressedRow& row_;
  int64_t e_;
  bool need_before_;
  int64_t before_;
};

// Whether a row read from outside (a cache file) is well formed for head dim
// D and `code_bytes` bytes per residual: every buffer of the right size for
// its layout, every anchor ordinal < n_anchor, anchor positions consistent,
// one residual slot per flagged token. Returns "" or what is wrong; nothing
// the kernels read can then fall outside the buffers.
std::string check_row(const CompressedRow& row, int64_t D, int64_t code_bytes);

// Decode one row into out_k / out_v ([length, D] f32).
void reconstruct_row(const CompressedRow& row, const ResidualCodec& codec, float* out_k, float* out_v);
// Same, written as fp16 ([length, D]); anchors are copied bit for bit.
void reconstruct_row_fp16(const CompressedRow& row, const ResidualCodec& codec, uint16_t* out_k,
                          uint16_t* out_v);

}  // namespace anchorkv::compress
