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
//
// Tight layout (MetadataLayout::kTight): as compact, with
//   meta16              [n_other] uint16: anchor K (bits 0..7), anchor V (8..15)
//   k.coef8, v.coef8    [n_other] uint8: bit 7 the sign of gamma, bit 6 the
//                       side's residual flag, m = bits 0..5 the magnitude:
//                       m = 0 means gamma = 0, else |gamma| = 2^((m + coef_exp) / 8)
//   k.coef_exp, v.coef_exp  one int8 per row and side (chosen so the row's
//                       largest |gamma| is in range; gamma = 1 is exact when in range)
// = 4 bytes per non-anchor token + 4 per anchor + 2 per row. Steps of 2^(1/8)
// put gamma within 4.4% of its value, small beside what an anchor leaves.
//
// Any layout, with key_rope enabled (keys given before RoPE): the key residual
// of token t is coded as RoPE_{offset + t}(r), so attention scores it with the
// query rotated to its own position; reconstruction rotates it back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anchorkv/config.h"
#include "compress/codec.h"
#include "compress/row_layout.h"

namespace anchorkv::compress {

struct CompressedSide {
  std::vector<float> coef;      // [n_other] (seed layout)
  std::vector<uint16_t> coef16; // [n_other] fp16 (compact layout)
  std::vector<uint8_t> coef8;   // [n_other] (tight layout)
  int8_t coef_exp = 0;          // (tight layout)
  std::vector<uint8_t> codes;   // [n_res, code_bytes]
  std::vector<uint16_t> scales; // [n_res] fp16
  int64_t n_residual() const { return static_cast<int64_t>(scales.size()); }
};

struct CompressedRow {
  int64_t length = 0;    // S, token positions in the segment
  int64_t n_anchor = 0;
  MetadataLayout layout = MetadataLayout::kSeed;
  // enabled: keys were given before RoPE and each key residual is coded after
  // RoPE at its position (key_rope.position_offset + token index); the rest
  // (anchors, gammas, value residuals) as given.
  RopeOptions key_rope;
  std::vector<uint16_t> anchor_k;  // [n_anchor, D] fp16
  std::vector<uint16_t> anchor_v;  // [n_anchor, D] fp16
  std::vector<uint64_t> meta;      // [n_other] (seed layout)
  std::vector<uint32_t> meta32;    // [n_other] (compact layout)
  std::vector<uint16_t> meta16;    // [n_other] (tight layout)
  std::vector<int32_t> anchor_pos; // [n_anchor] (compact and tight layouts)
  CompressedSide k, v;

  // Compact and tight rows list their anchor positions (anchors_before is derived).
  bool lists_positions() const {
    return with_layout(layout, [](auto L) { return L.kListsPositions; });
  }
  int64_t n_other() const {
    return with_layout(layout, [&](auto L) { return static_cast<int64_t>(L.words(*this).size()); });
  }
  // Entry e's metadata in any layout (compact, tight: anchors_before by binary search).
  Meta meta_at(int64_t e) const;
  // Entry e's metadata without anchors_before.
  Meta fields_at(int64_t e) const {
    return with_layout(layout, [&](auto L) { return L.fields(*this, e); });
  }
  bool res_k(int64_t e) const {
    return with_layout(layout, [&](auto L) { return L.res_k(*this, e); });
  }
  bool res_v(int64_t e) const {
    return with_layout(layout, [&](auto L) { return L.res_v(*this, e); });
  }
  float coef_k(int64_t e) const;
  float coef_v(int64_t e) const;
  int64_t n_residual() const { return k.n_residual() + v.n_residual(); }
  // Sum of the sizes of the buffers above (what is really held).
  int64_t buffer_bytes() const;
  // Anchor positions, ascending, recovered from the metadata.
  std::vector<int32_t> anchor_positions() const;
};

// Residual slots before every kSlotIndexBlock-th entry of a row: index[2 b]
// K slots and index[2 b + 1] V slots before entry min(b * kSlotIndexBlock,
// n_other), for b = 0 .. ceil(n_other / kSlotIndexBlock). Attention starts
// its chunks of entries on these blocks and reads a chunk's first slots here
// instead of counting every flag before the chunk (a pass over the row's
// metadata per call). Derived from the flags, kept in memory beside the row
// (docs/storage.md), never stored.
inline constexpr int64_t kSlotIndexBlock = 1024;
std::vector<int64_t> residual_slot_index(const CompressedRow& row);

// Reads the metadata of entries e0, e0 + 1, ... of a row in either layout.
// With `need_before`, compact rows find anchors_before by one binary search,
// then step it (amortised O(1) per entry); otherwise it is left 0 for them.
class EntryMetaReader {
 public:
  EntryMetaReader(const CompressedRow& row, int64_t e0, bool need_before)
      : row_(row), e_(e0), need_before_(need_before),
        before_(row.lists_positions() && need_before ? row.meta_at(e0).anchors_before : 0) {}
  Meta next() {
    const int64_t e = e_++;
    if (!row_.lists_positions()) return unpack_meta(row_.meta[e]);
    Meta m = row_.fields_at(e);
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

// `prior` followed by `part`, a row compressed to extend it
// (SegmentInput::extends): the part's anchors after the prior's (its ordinals
// already index that table), its entries, coefficients and residual slots
// after the prior's, its positions shifted by prior.length. Returns a new
// row; throws Error(kInvalidArgument) when the two do not fit together
// (layouts, tight exponents, key_rope offsets).
CompressedRow extend_row(const CompressedRow& prior, const CompressedRow& part);

// Decode one row into out_k / out_v ([length, D] f32).
void reconstruct_row(const CompressedRow& row, const ResidualCodec& codec, float* out_k, float* out_v);
// Same, written as fp16 ([length, D]); anchors are copied bit for bit.
void reconstruct_row_fp16(const CompressedRow& row, const ResidualCodec& codec, uint16_t* out_k,
                          uint16_t* out_v);

}  // namespace anchorkv::compress
