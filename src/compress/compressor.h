// AnchorKV compression of one prefill segment, all (batch, head) rows.
//
// Two paths produce the same CompressedRows:
//  * compress_reference: the readable scalar definition, one thread, row by row.
//  * compress: the fast path (SIMD kernels, parallel over rows and over token
//    chunks inside rows), bit-identical for every thread count.
// Both share the allocation (budget + top-N) and the encoder.
#pragma once

#include <cstdint>
#include <vector>

#include "anchorkv/config.h"
#include "anchorkv/stats.h"
#include "compress/assignment.h"
#include "compress/codec.h"
#include "compress/segment.h"
#include "compress/utility.h"
#include "core/buffer.h"

namespace anchorkv::compress {

// Contiguous [B, H, S, D] f32 K and V whose values are fp16-representable.
struct SegmentInput {
  int64_t B = 0, H = 0, S = 0, D = 0;
  const float* K = nullptr;
  const float* V = nullptr;
  // Optional real observation queries of the segment's last W positions, per
  // row [G, W, D] (row r at Q + r * G * W * D); null: the trailing keys act as
  // queries (the seed).
  const float* Q = nullptr;
  int64_t G = 0, W = 0;
  // The queries sit after the segment (a streaming segment scored by the
  // recent window's queries): each sees all S positions.
  bool queries_after = false;
  // Optional: the rows [B * H] of the segment this one extends (a streaming
  // segment appended to the one before it, extend_row). Its anchors come
  // first in each row's anchor table, so tokens may take them as well as the
  // segment's own; the tight layout keeps its coefficient exponents.
  const CompressedRow* extends = nullptr;
  int64_t n_prior(int64_t row) const { return extends ? extends[row].n_anchor : 0; }
  const float* key_row(int64_t row) const { return K + row * S * D; }
  const float* value_row(int64_t row) const { return V + row * S * D; }
  int64_t rows() const { return B * H; }
  // What observes row `row`'s attention (compress/utility.h).
  Observers observers(int64_t row, int64_t window) const {
    return Q ? query_observers(Q + row * G * W * D, G, W, queries_after) : proxy_observers(key_row(row), S, D, window);
  }
};

// What compression decides for one row before residuals are allocated.
struct RowAnalysis {
  std::vector<int32_t> anchors;  // sorted positions of the segment's own anchors
  SideAssignment k, v;           // [S] ordinal into the anchor table (anchor_table) and gamma per side
  Utilities utility;             // [S] per side, -inf at anchors
};

// Which tokens get residuals, per row, ascending positions.
struct ResidualChoice {
  std::vector<std::vector<int32_t>> k, v;  // [rows]
};

// The seed of row (b * H + h)'s uniform anchor draw.
uint64_t row_seed(uint64_t seed, int64_t row);

// Throws Error(kUnsupported) when the segment cannot be stored in the seed layout.
void check_segment(const SegmentInput& in, const AnchorKVConfig& config);
// The most anchors of its own a segment may take: the layout's limit less
// the anchors of the segment it extends.
int64_t own_anchor_limit(const SegmentInput& in, MetadataLayout layout);
// Row `row`'s prior anchors (SegmentInput::extends) of one side, f32 [n, D].
std::vector<float> prior_anchors(const SegmentInput& in, int64_t row, bool values);

std::vector<RowAnalysis> analyze_reference(const SegmentInput& in, const AnchorKVConfig& config);

// What every anchor count's analysis of a segment shares: per row, the
// observers' attention over its positions, alpha [S, m] (softmax over
// positions), and their outputs y [m, D] (sum over t of alpha[t, w] V[t]).
// :auto analyses several anchor counts against one of these.
struct SegmentObservation {
  struct Row {
    core::UninitVector<float> alpha;
    std::vector<float> y;
  };
  std::vector<Row> rows;
  double seconds = 0;  // spent computing it
};
SegmentObservation observe(const SegmentInput& in, const AnchorKVConfig& config);

std::vector<RowAnalysis> analyze(const SegmentInput& in, const AnchorKVConfig& config, const SegmentObservation& obs,
                                 CompressionStats* stats = nullptr);
// The same, observing first.
std::vector<RowAnalysis> analyze(const SegmentInput& in, const AnchorKVConfig& config,
                                 CompressionStats* stats = nullptr);

ResidualChoice allocate_residuals(const SegmentInput& in, const AnchorKVConfig& config,
                                  const std::vector<RowAnalysis>& analysis);

// layout: compact stores fp16 gammas, tight 8-bit ones (segment.h); residuals
// are computed against the gammas as stored. key_rope (enabled): key residuals
// are coded after RoPE at their positions (AnchorKVConfig::key_rope).
std::vector<CompressedRow> encode_rows(const SegmentInput& in, const ResidualCodec& codec,
                                       const std::vector<RowAnalysis>& analysis,
                                       const ResidualChoice& choice, int threads,
                                       MetadataLayout layout = MetadataLayout::kSeed,
                                       const RopeOptions& key_rope = {});

// AnchorCount::kAuto (docs/spec.md §4.7). The anchor fractions tried: none
// of its own when the segment extends another and the configured one's
// anchors and metadata would take over half of theta's bytes, the
// configured one, then 2,
// 4, ... (up to 2^kMaxAnchorDoublings) times its anchors while they stay
// within S / 2, the layout's limit and theta's bytes with the metadata. Just
// the configured one for kFixed.
inline constexpr int kMaxAnchorDoublings = 4;
std::vector<double> anchor_fractions(const SegmentInput& in, const AnchorKVConfig& config);
// Relative squared error a b-bit residual leaves (Lloyd-Max for a Gaussian coordinate).
double residual_distortion(int bits);
// Estimated squared attention-output error of a segment: the sum of the Eq. 6
// utilities of the tokens without a residual plus residual_distortion(bits)
// times those of the tokens with one (anchors are exact).
double estimated_error(const std::vector<RowAnalysis>& analysis, const ResidualChoice& choice, int bits);

std::vector<CompressedRow> compress_reference(const SegmentInput& in, const AnchorKVConfig& config,
                                              const ResidualCodec& codec);
std::vector<CompressedRow> compress(const SegmentInput& in, const AnchorKVConfig& config,
                                    const ResidualCodec& codec, CompressionStats* stats = nullptr);

}  // namespace anchorkv::compress
