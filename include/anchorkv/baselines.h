// Baseline caches for comparisons at matched bytes. Each is a KVCache with
// true byte accounting (nbytes() = what it really stores) and sizes itself
// from a byte budget `theta` (a fraction of the fp16 K+V bytes of the
// prefill), the same knob AnchorKV uses.
//
// Eviction caches (StreamingLLM, SnapKV, H2O) keep about theta * S tokens of
// the first prefill (S > 1 call) and report tokens_kept < tokens_total.
// Quantized caches cannot go below their bit width: their size is fixed and a
// comparison marks them over budget. All are thread-safe like every KVCache.
#pragma once

#include <cstdint>
#include <string>

#include "anchorkv/cache.h"

namespace anchorkv {

// Group-wise affine quantization along D (as mlx_lm's QuantizedKVCache):
// groups of `group_size` coordinates, x ~ scale * q + bias, q in [0, 2^bits),
// fp16 scale and bias per group. Every token (prefill and decode) is quantized.
// attend() reads the codes in place (no fp16 rebuild) when every token's and
// group's codes fill whole bytes (D * bits a multiple of 8, and group_size * bits
// too unless one group spans D).
class QuantizedKVCache final : public KVCache {
 public:
  explicit QuantizedKVCache(int bits = 4, int64_t group_size = 64);  // bits 2, 4 or 8
  // Bytes one token of one row and side takes: ceil(D*bits/8) + 4 * ceil(D/group).
  static int64_t token_side_bytes(int64_t D, int bits, int64_t group_size);
};

// KIVI (Liu et al., 2024): keys quantized per channel over groups of
// `group` tokens, values per token over groups of `group` channels (fp16 scale
// and zero point per group), the most recent `residual` tokens kept in fp16.
// Tokens leave the fp16 window in whole key groups. Size is fixed by `bits`.
// attend() reads the codes in place when D * bits is a multiple of 8, and
// group * bits too unless one group spans D.
class KIVICache final : public KVCache {
 public:
  explicit KIVICache(int bits = 2, int64_t group = 32, int64_t residual = 32);  // bits 2 or 4
};

// TurboQuant (Zandieh et al., 2025; its MSE quantizer): every token's key and
// value rotated by a seeded orthogonal transform (randomized Hadamard for
// power-of-two sizes), each rotated coordinate coded on its own with the
// Lloyd-Max levels of N(0, 1) after dividing by the vector's RMS, which is kept
// in fp16. Key and value widths are chosen separately, 1 to 4 bits in steps of
// 0.25: a fractional width gives round(frac * D) channels (those the first
// tokens show largest) one bit more, as a second group with its own rotation
// and scale (the paper's outlier split: 2.5 bits = half the channels at 3, half
// at 2). Every token, decode included, is coded on append; attention scores
// the codes against the rotated query and never rebuilds fp16 K/V. Keys are
// stored as given (attention refuses RoPE inside it). Size is fixed by the widths.
class TurboQuantCache final : public KVCache {
 public:
  explicit TurboQuantCache(double key_bits = 4, double value_bits = 4, uint64_t seed = 0x7475726271ULL);
  // Bytes one token of one row and side takes: the codes and one fp16 scale per channel group.
  static int64_t token_side_bytes(int64_t D, double bits);
  // "k4v3", "k2.5v2": the widths as the registry's modifier writes them.
  static std::string width_name(double key_bits, double value_bits);
};

// StreamingLLM: `sinks` attention-sink tokens plus the most recent tokens,
// theta * S in all; decode keeps the size constant (oldest non-sink evicted).
class StreamingLLMCache final : public KVCache {
 public:
  explicit StreamingLLMCache(double theta = 0.05, int64_t sinks = 4);
};

// SnapKV: the trailing `window` keys act as observation queries (key-as-query,
// as AnchorKV's scoring); attention averaged over them and smoothed with an
// average pool of width `kernel` ranks the other positions; the top ones plus
// the window are kept (theta * S in all). Decode tokens are appended.
class SnapKVCache final : public KVCache {
 public:
  explicit SnapKVCache(double theta = 0.05, int64_t window = 32, int64_t kernel = 7);
};

// H2O (Zhang et al., 2023): heavy hitters by accumulated attention plus a
// recent window (half the budget each). A cache sees no queries, so keys act
// as queries (as in AnchorKV's scoring): at prefill every key attends causally
// over the prefix and each token's score is the attention it receives; during
// decode each new key adds its attention over the kept tokens, and the
// lowest-scoring token outside the recent window is evicted (constant size).
// The accumulated scores are stored (fp32 per kept token) and counted in nbytes.
class H2OCache final : public KVCache {
 public:
  explicit H2OCache(double theta = 0.05, double recent_share = 0.5);
};

}  // namespace anchorkv
