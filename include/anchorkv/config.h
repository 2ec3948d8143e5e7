// AnchorKVConfig: the seed's six fields with the seed's defaults, plus the
// options this project adds, each with its default (why each default was
// chosen, with the measurements: docs/results.md and docs/codec.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anchorkv {

// Rotary position embedding applied inside attention, for caches that store
// keys BEFORE RoPE (the paper's setting, §3.2): with `enabled`, the query and
// the cached keys are pre-RoPE, and attention rotates the query at its
// position and every key at its position (the cache's token index + offset).
// (AttentionOptions::rope; AnchorKVConfig::key_rope below.)
enum class RopeStyle : uint8_t {
  kNormal,  // adjacent pairs (2i, 2i+1): Llama / Mistral as GGUF stores them
  kNeox,    // split halves (i, i + D/2): GPT-NeoX / Qwen2
};
struct RopeOptions {
  bool enabled = false;
  double base = 10000.0;
  RopeStyle style = RopeStyle::kNormal;
  int64_t position_offset = 0;  // position of the cache's first token
  // Pair i of a head of dim D turns by base^(-2i/D) * freq_scale[i] per
  // position; empty means 1 for every pair, else D/2 finite values > 0. This
  // is what a model's RoPE scaling comes to: Llama 3.1's rope_freqs
  // (1 / factor_i), linear scaling (1 / factor), YaRN's ramp between the two.
  std::vector<double> freq_scale;
};

// How the residual byte budget is shared (docs/spec.md §4.4).
enum class ResidualAllocation : uint8_t {
  kPooledAcrossHeads,  // seed / paper §3.4: one budget per batch element, all heads compete
  kPerHead,            // the budget formula applied to each (batch, head) row alone
};

// Per-token scale of the residual codec (docs/spec.md §4.5).
enum class ResidualScale : uint8_t {
  kAbsMax,  // seed: max |coordinate|, coordinates land in [-1, 1]
  kRms,     // ||R r|| / sqrt(D): unit-variance coordinates, matching the Gaussian codebook
};

// When the exact tokens fed so far are compressed (docs/spec.md §3, §6).
enum class CompressTrigger : uint8_t {
  kFirstPrefill,  // seed: the first call with S > 1 is compressed, on its own
  kFirstDecode,   // chunked prefill: every call with S > 1 is appended exactly; the
                  // first S == 1 call after them compresses all tokens stored so far
};

// Per-token metadata layout of compressed tokens (docs/spec.md §5).
enum class MetadataLayout : uint8_t {
  kSeed,     // seed accounting: an int32-sized index and an fp32 coefficient per side (16 bytes/token)
  kCompact,  // uint16 index + fp16 coefficient per side (8 bytes/token) + the anchor positions (4 bytes
             // per anchor); needs k < 32768 anchors per segment
  kTight,    // uint8 index + one byte (sign, residual flag, 6-bit log magnitude) per side (4 bytes/token)
             // + the anchor positions (4 bytes per anchor) + 2 bytes per row; k is capped at 256
};

// How many anchors a compressed segment gets (docs/spec.md §4.7).
enum class AnchorCount : uint8_t {
  kFixed,  // seed: k = round(S * anchor_frac)
  kAuto,   // per segment (one layer's prefill): k = round(S * anchor_frac) * 2^i for the i
           // (0..4) whose anchors fit theta's bytes and whose estimated attention-output
           // error (Eq. 6 utilities of the tokens left without a residual, plus the codec's
           // distortion times those with one) is least
};

struct AnchorKVConfig {
  // --- the seed's fields (anchorkv_*), same names without the prefix ---
  double theta = 0.05;              // fraction of fp16 K+V bytes to retain, 0 <= theta <= 1
  int64_t window = 32;              // trailing anchors and proxy queries, >= 0
  double rho = 0.7;                 // scored share of the non-window anchors, 0 <= rho <= 1
  double anchor_frac = 1.0 / 128;   // anchor budget k as a fraction of S, 0 < f <= 1
  int residual_bits = 2;            // bits per residual coordinate: 1, 2, 3 or 4
  uint64_t seed = 42;               // uniform anchor share + codec rotation

  // --- options added by this project ---
  ResidualAllocation allocation = ResidualAllocation::kPooledAcrossHeads;
  ResidualScale scale = ResidualScale::kRms;  // kAbsMax is the seed's behaviour
  CompressTrigger trigger = CompressTrigger::kFirstPrefill;
  MetadataLayout metadata = MetadataLayout::kSeed;  // the budget and accounting use its real size
  AnchorCount anchor_count = AnchorCount::kFixed;
  int threads = 0;  // worker threads for compression/reconstruction; 0 = all cores.
                    // Output is bit-identical for every value.
  // Keys fed BEFORE RoPE and attended with exactly these options (base, style,
  // position_offset = position of the cache's first token): each key residual
  // is coded after RoPE at its own position, so attention scores it like a
  // post-RoPE residual instead of rotating it to its position every call.
  // attend() refuses other RoPE options on such a cache; fetch() still returns
  // the keys before RoPE. Off (the default): residuals are coded as given and
  // attention rotates them (docs/results.md compares the two).
  RopeOptions key_rope;

  // Streaming (segments). 0 (the default) is the seed's behaviour: compress
  // once, at the trigger, and keep every later token exact. T > 0: every
  // token enters an exact tail; whenever the tail holds recent_tokens + T
  // tokens or more, its oldest T become a new compressed segment under the
  // same theta, so a session of any length stays compressed (the trigger is
  // not used; compress_now() closes the whole tail as one segment). Observation
  // queries given with calls are kept for the newest `window` positions and
  // score each segment as it closes (docs/spec.md §4.8).
  int64_t segment_tokens = 0;
  int64_t recent_tokens = 0;  // exact tokens kept behind the newest segment (streaming only)
  // Streaming: a segment that closes extends the one before it while the two
  // hold at most extend_tokens tokens: its tokens may take that segment's
  // anchors as well as their own, and the two become one segment. 0 (the
  // default): every segment is compressed on its own, with its own anchors.
  int64_t extend_tokens = 0;

  bool streaming() const { return segment_tokens > 0; }

  // Throws anchorkv::Error(kInvalidConfig) naming the first invalid field.
  void validate() const;
  std::string to_string() const;
};

const char* to_string(ResidualAllocation v);
const char* to_string(ResidualScale v);
const char* to_string(CompressTrigger v);
const char* to_string(MetadataLayout v);
const char* to_string(AnchorCount v);

}  // namespace anchorkv
