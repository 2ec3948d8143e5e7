// Whole tokens coded by the residual codec: TurboQuant's quantizer (Zandieh
// et al., 2025, "TurboQuant_mse"). A token's D channels fall in one or two
// groups; each group is rotated by its own seeded orthogonal transform and
// every rotated coordinate is coded on its own with the Lloyd-Max levels of
// N(0, 1), after dividing by the group's RMS (stored in fp16: the vector's
// norm / sqrt(dim), so the rotated coordinates are ~N(0, 1) whatever the
// vector). That is compress::ResidualCodec with ResidualScale::kRms, applied
// to the token instead of a residual.
//
// Fractional widths split the channels (the paper's outlier split): at b + f
// bits (f in {0.25, 0.5, 0.75}), round(f * D) channels — the ones a row's first
// tokens show largest (choose_wide_channels) — take b + 1 bits and the rest b,
// each group with its own rotation and scale.
#pragma once

#include <cstdint>
#include <vector>

#include "compress/codec.h"

namespace anchorkv::compress {

class TokenCoder {
 public:
  // quarter_bits: bits per channel times 4, in [4, 16] (1 to 4 bits in steps of 0.25).
  TokenCoder(int64_t D, int quarter_bits, uint64_t seed);

  int64_t dim() const { return D_; }
  int quarter_bits() const { return quarter_bits_; }
  int groups() const { return static_cast<int>(codecs_.size()); }
  // Group g's channels are channels[offset(g) .. offset(g) + group_dim(g)) of
  // a row's channel order: group 0 the narrower codes, group 1 the wider.
  int64_t group_dim(int g) const { return codecs_[static_cast<size_t>(g)].dim(); }
  int64_t offset(int g) const { return g == 0 ? 0 : group_dim(0); }
  const ResidualCodec& codec(int g) const { return codecs_[static_cast<size_t>(g)]; }
  int64_t code_bytes(int g) const { return codec(g).code_bytes(); }
  // Channels that take the wider codes (0 for whole widths).
  int64_t wide_channels() const { return groups() == 2 ? group_dim(1) : 0; }
  // Bytes one token takes: every group's codes and its fp16 scale.
  int64_t token_bytes() const;

  // x [D] -> codes[g] (code_bytes(g) bytes) and scales[g] per group, the
  // channels taken in `channels` order [D]. scratch: 4 * D floats.
  void encode(const float* x, const int32_t* channels, uint8_t* const* codes, uint16_t* scales,
              float* scratch) const;
  // The reconstruction [D] of one token: per group R^T (s * level[code]),
  // written back to its channels. scratch: 2 * D floats.
  void decode(const uint8_t* const* codes, const uint16_t* scales, const int32_t* channels, float* out,
              float* scratch) const;

 private:
  int64_t D_;
  int quarter_bits_;
  std::vector<ResidualCodec> codecs_;
};

// One side of one row as attention reads it: token t's codes of group g at
// codes[g] + t * coder->code_bytes(g), its scale at scales[g][t].
struct CodedSideView {
  const TokenCoder* coder = nullptr;
  const int32_t* channels = nullptr;  // [D] the row's channel order
  const uint8_t* codes[2] = {nullptr, nullptr};
  const uint16_t* scales[2] = {nullptr, nullptr};
};
struct CodedRowView {
  CodedSideView k, v;
};

// The channel order of a row: the D - wide narrower channels ascending, then
// the `wide` channels of largest mean square over x [n, D] (ties to the lower
// index), ascending. With wide == 0 it is 0 .. D - 1.
std::vector<int32_t> choose_wide_channels(const float* x, int64_t n, int64_t D, int64_t wide);

// Whether `channels` [D] is an order choose_wide_channels could give: a
// permutation of 0 .. D - 1, ascending within each group.
bool valid_channel_order(const int32_t* channels, int64_t D, int64_t wide);

}  // namespace anchorkv::compress
