// What attention reads from a cache: the regions of every (batch, KV head)
// row in position order, each either exact fp16 tokens or a compressed
// AnchorKV segment. A cache gets attention (kernels/attend) by describing its
// storage this way; nothing in it is copied.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "anchorkv/cache.h"
#include "cache/affine.h"
#include "cache/input.h"
#include "compress/codec.h"
#include "compress/segment.h"
#include "compress/token_coder.h"

namespace anchorkv::cache {

// Every token of positions pos0 .. pos0 + n - 1, each kept whole: per row
// exact fp16 K and V [n, D] (k, v), or codes of whole tokens: coded
// (TurboQuant's, scored in their rotated domain) or affine (the quantized
// baselines', scored on their integer codes). Only one of the three is filled.
struct DenseRegion {
  std::vector<const uint16_t*> k, v;             // [rows]
  std::vector<compress::CodedRowView> coded;     // [rows]
  std::vector<AffineRowView> affine;             // [rows]
  int64_t n = 0, pos0 = 0;
  bool is_coded() const { return !coded.empty(); }
  bool is_affine() const { return !affine.empty(); }
};

// A compressed segment: one CompressedRow per row, `tokens` positions from pos0.
struct CompressedRegion {
  const std::vector<compress::CompressedRow>* rows = nullptr;  // [rows]
  const compress::ResidualCodec* codec = nullptr;
  int64_t tokens = 0, pos0 = 0;
  // compress::residual_slot_index of each row (attention refuses a segment without)
  const std::vector<std::vector<int64_t>>* slot_index = nullptr;
  // CompressedRow::anchor_positions of each row, or null (found per call);
  // rows that list their positions (compact, tight) may hold none here
  const std::vector<std::vector<int32_t>>* anchor_pos = nullptr;
};

struct AttentionSource {
  AttentionSource() = default;
  AttentionSource(int64_t b, int64_t h, int64_t d, int64_t n) : B(b), H(h), D(d), n_total(n) {}
  int64_t B = 0, H = 0, D = 0;
  int64_t n_total = 0;  // positions per row attention sees (kept tokens for evicting caches)
  std::vector<DenseRegion> dense_before;        // regions before the segments, in position order
  std::vector<CompressedRegion> segments;       // compressed segments, contiguous, in position order
  std::vector<DenseRegion> dense_after;         // regions after them (all regions when there is none)
  // Dense copies the source points into, for caches with no kernel of their
  // own (the generic path); empty otherwise.
  std::vector<std::shared_ptr<const KVPair>> owned;

  int64_t rows() const { return B * H; }
  // Whether any region, before or after the segments, holds codes of that kind.
  bool holds_coded() const;
  bool holds_affine() const;
};

// Exact rows as a region whose first token sits at pos0.
DenseRegion dense_region(const ExactRows& rows, int64_t pos0);

// The dense fetch of a cache as a source (the generic path).
AttentionSource dense_source(KVPair fetched);

// Appends `next`'s positions after `into`'s (the concatenation of two caches'
// contents). An empty `into` becomes `next`. Throws Error(kShapeMismatch) when
// B, H or D differ and Error(kUnsupported) when `next` holds compressed
// segments behind other positions (attention takes the segments of the first
// cache only).
void append_source(AttentionSource& into, AttentionSource&& next, const char* op);

}  // namespace anchorkv::cache
